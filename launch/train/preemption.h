// Stopping a run that a cluster is about to end, on every rank at the same step, so that it can
// be saved and resumed with nothing lost (issue 25).
//
// A stop signal (by default SIGTERM, SIGINT and SIGUSR1; `[train] stop_signals`) only sets a
// flag: the handler does nothing else, so it is async-signal-safe and a second signal during the
// save changes nothing. Rank 0's clock against `[train] time_limit` is the other reason to stop.
// Ranks must stop together, or the ones that go on wait forever in the next gradient all-reduce;
// so at each optimizer-step boundary every rank puts its flag (and rank 0 its clock's verdict)
// into a non-blocking all-reduce (MAX) that the next boundary completes. No step waits on it
// (it finished long before, during the step), and every rank reads the same agreed value at the
// same boundary: a signal that reaches any one rank during step k stops every rank after step
// k + 1. On one rank the flag is read at once. An accumulating run stops only at an optimizer
// step (no partial gradient is lost), and a stop due at the run's last step lets it finish.
// With no signal and no time limit to watch, the hook makes no collective.
//
// PreemptionHook (launch/train/hooks/preemption_hook.h) only decides: it sets
// TrainingContext::stop and ::preempted, and CheckpointHook then writes the mid-epoch checkpoint
// (launch/train/hooks/checkpoint_hook.h). The handlers it installs
// are restored when training ends, also by an exception: the library may be embedded in a code
// with handlers of its own. `mpigrad train` then exits with kPreemptedExitStatus.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mpigrad::launch {

// What `mpigrad train` returns after a stop on a signal or the time limit, its checkpoint
// written: 75 is EX_TEMPFAIL of <sysexits.h>, "try again later". A batch script requeues on it.
inline constexpr int kPreemptedExitStatus = 75;

// The signal numbers of "TERM,INT,USR1" (names with or without SIG, any case; "" or "none": no
// signal). Only signals that a scheduler or a user sends to ask for an end are accepted: TERM,
// INT, HUP, QUIT, USR1, USR2, XCPU. Anything else is a core::Error starting with `where`.
std::vector<int> parse_stop_signals(const std::string& text, const std::string& where);
// "USR1" for SIGUSR1 (the form parse_stop_signals reads), or the number.
std::string stop_signal_name(int signal);
// The names parse_stop_signals accepts, "TERM, INT, ...", for messages.
std::string stop_signal_names();

// Which ranks had received a stop signal when the ranks agreed to stop, for the stop line: each
// rank adds its own to a SignalTally, the ranks sum theirs (one all-reduce), and describe() says
// "signal USR1 on all 4 ranks", "signal USR1 on rank 1", "signal TERM on 2 of 4 ranks" or
// "signal USR1 on 3 of 4 ranks and TERM on 1 of 4 ranks" (a rank is named only when it alone was
// signalled: the tally is one sum): a scheduler signals every rank, a user may signal one, and
// the line should not tell them apart wrongly.
struct SignalTally {
  static constexpr int kSignals = 65;  // signal numbers 1..64; slot 0 holds the ranks' sum
  std::vector<int64_t> counts = std::vector<int64_t>(kSignals, 0);
  // This rank (world rank `rank`) last received `signal` (0: none).
  void add(int signal, int rank);
  std::string describe(int world_size) const;
};

// Seconds of "3h50m", "90m", "45s", "1h", "1h30m15s" or "2d" (d, h, m, s in that order, each at
// most once, whole numbers); "", "0" or "none" is 0 (no limit). Anything else is a core::Error
// starting with `where`.
int64_t parse_duration(const std::string& text, const std::string& where);
// The shortest such text for `seconds` ("3h50m"; 0 gives "0"), which parse_duration reads back.
std::string format_duration(int64_t seconds);

// Installs a flag-setting handler for each signal and restores the previous handlers when
// destroyed. One at a time per process (a signal handler can only reach process-wide state):
// a second is a core::Error.
class StopSignalHandlers {
 public:
  explicit StopSignalHandlers(const std::vector<int>& signals);
  ~StopSignalHandlers();
  StopSignalHandlers(const StopSignalHandlers&) = delete;
  StopSignalHandlers& operator=(const StopSignalHandlers&) = delete;
  // The last stop signal received since construction, or 0.
  int received() const;

 private:
  struct Saved;
  std::vector<Saved> saved_;
};

// Tests only, MPIGRAD_TEST_RAISE_SIGNAL = "RANK:STEP:SIGNAL[,...]": rank RANK raises SIGNAL at the
// end of optimizer step STEP, or, for STEP "stop", once the stop is decided and before the
// checkpoint is written. It makes a signal land at a known step, deterministically.
struct TestSignal {
  int rank;
  int64_t step;  // -1: at the stop
  int signal;
};
// The variable's signals (none when unset or empty); a malformed value is a core::Error naming it.
std::vector<TestSignal> test_signals_from_environment();

}  // namespace mpigrad::launch
