#include "mpigrad/launch/train/preemption.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/peer_liveness.h"
#include "mpigrad/launch/job/distributed_manager.h"

namespace mpigrad::launch {

namespace {

struct NamedSignal {
  const char* name;
  int number;
};
// The signals that mean "end soon": schedulers send TERM (Slurm, PBS, LSF), USR1/USR2 (Slurm's
// --signal), XCPU (a CPU-time limit), HUP (a lost session); INT and QUIT come from a terminal.
constexpr NamedSignal kStopSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},
                                        {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
                                        {"XCPU", SIGXCPU}};

std::string upper(std::string text) {
  for (char& c : text) c = char(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const char* space = " \t\r\n";
  size_t begin = text.find_first_not_of(space), end = text.find_last_not_of(space);
  return begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (true) {
    size_t end = text.find(separator, begin);
    items.push_back(trim(text.substr(begin, end == std::string::npos ? end : end - begin)));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return items;
}

// The handler's whole world: process-wide by necessity (a handler receives only the signal
// number), written only by the handler and by StopSignalHandlers, read at step boundaries. A
// lock-free atomic rather than a volatile sig_atomic_t: the kernel may run the handler on any
// thread (a loader worker, an MPI progress thread), and a lock-free atomic is both safe in a
// handler and seen by the training thread.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<bool> g_installed{false};

extern "C" void set_stop_flag(int signal) {
  g_stop_signal.store(signal);
  // Open MPI's mpirun ends the other ranks with TERM when one dies: then the lost rank is named
  // and this one ends (peer_liveness.h), instead of a stop that can never be agreed on.
  if (signal == SIGTERM) notice_termination_signal(signal, /*end_process=*/false);
}

}  // namespace

std::string stop_signal_names() {
  std::string names;
  for (const NamedSignal& s : kStopSignals)
    names += std::string(names.empty() ? "" : ", ") + s.name;
  return names;
}

std::vector<int> parse_stop_signals(const std::string& text, const std::string& where) {
  std::vector<int> signals;
  const std::string trimmed = trim(text);
  if (trimmed.empty() || upper(trimmed) == "NONE") return signals;
  for (const std::string& item : split(trimmed, ',')) {
    std::string name = upper(item);
    if (name.starts_with("SIG")) name = name.substr(3);
    const NamedSignal* found = nullptr;
    for (const NamedSignal& s : kStopSignals) {
      if (name == s.name) found = &s;
    }
    MPIGRAD_CHECK(found != nullptr, where, ": '", item,
                  "' is not a stop signal; expected a comma-separated list of ",
                  stop_signal_names(), ", or none");
    MPIGRAD_CHECK(std::find(signals.begin(), signals.end(), found->number) == signals.end(), where,
                  ": ", found->name, " is listed twice");
    signals.push_back(found->number);
  }
  return signals;
}

void SignalTally::add(int signal, int rank) {
  if (signal <= 0 || signal >= kSignals) return;
  counts[size_t(signal)] += 1;
  counts[0] += rank;
}

std::string SignalTally::describe(int world_size) const {
  int64_t signalled = 0;
  for (int s = 1; s < kSignals; ++s) signalled += counts[size_t(s)];
  std::string text;
  for (int s = 1; s < kSignals; ++s) {
    const int64_t ranks = counts[size_t(s)];
    if (ranks == 0) continue;
    text += text.empty() ? "signal " : " and ";
    text += stop_signal_name(s) + " on ";
    // The ranks' sum names the one rank when only one was signalled.
    if (signalled == 1) {
      text += "rank " + std::to_string(counts[0]);
    } else if (ranks == world_size) {
      text += "all " + std::to_string(world_size) + " ranks";
    } else {
      text += std::to_string(ranks) + " of " + std::to_string(world_size) + " ranks";
    }
  }
  return text;
}

std::string stop_signal_name(int signal) {
  for (const NamedSignal& s : kStopSignals) {
    if (s.number == signal) return s.name;
  }
  return std::to_string(signal);
}

int64_t parse_duration(const std::string& text, const std::string& where) {
  const std::string value = trim(text);
  if (value.empty() || value == "0" || value == "none") return 0;
  auto bad = [&](const std::string& why) {
    core::fail(where, ": '", text, "' is not a duration (", why,
               "); expected e.g. 3h50m, 90m, 45s or 1h: whole numbers of d, h, m, s in that "
               "order, or 0 for no limit");
  };
  constexpr struct {
    char unit;
    int64_t seconds;
  } kUnits[] = {{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
  int64_t total = 0;
  size_t next_unit = 0, i = 0;
  while (i < value.size()) {
    size_t digits_end = i;
    while (digits_end < value.size() && std::isdigit(static_cast<unsigned char>(value[digits_end])))
      ++digits_end;
    if (digits_end == i) bad("a number must come before each unit");
    if (digits_end == value.size()) bad("the last number has no unit (d, h, m or s)");
    if (digits_end - i > 9) bad("a number is too large");
    const int64_t number = std::stoll(value.substr(i, digits_end - i));
    const char unit = char(std::tolower(static_cast<unsigned char>(value[digits_end])));
    size_t u = next_unit;
    while (u < std::size(kUnits) && kUnits[u].unit != unit) ++u;
    if (u == std::size(kUnits)) {
      bool known = unit == 'd' || unit == 'h' || unit == 'm' || unit == 's';
      bad(known ? "units must come in the order d, h, m, s, each once"
                : std::string("unknown unit '") + value[digits_end] + "'");
    }
    total += number * kUnits[u].seconds;
    next_unit = u + 1;
    i = digits_end + 1;
  }
  return total;
}

std::string format_duration(int64_t seconds) {
  if (seconds <= 0) return "0";
  std::string text;
  for (auto [unit, size] : {std::pair{'d', int64_t(86400)}, std::pair{'h', int64_t(3600)},
                            std::pair{'m', int64_t(60)}, std::pair{'s', int64_t(1)}}) {
    if (seconds >= size) {
      text += std::to_string(seconds / size) + unit;
      seconds %= size;
    }
  }
  return text;
}

// ---- StopSignalHandlers
// --------------------------------------------------------------------------

struct StopSignalHandlers::Saved {
  int signal;
  struct sigaction previous;
};

StopSignalHandlers::StopSignalHandlers(const std::vector<int>& signals) {
  MPIGRAD_CHECK(!g_installed.exchange(true),
                "StopSignalHandlers: stop-signal handlers are already installed in this process; "
                "one training run at a time can own them");
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = set_stop_flag;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a system call the signal interrupts (a write of the checkpoint, a read of the
  // data) resumes instead of failing with EINTR.
  action.sa_flags = SA_RESTART;
  for (int signal : signals) {
    Saved saved{signal, {}};
    if (sigaction(signal, &action, &saved.previous) != 0) {
      for (const Saved& done : saved_) sigaction(done.signal, &done.previous, nullptr);
      g_installed = false;
      core::fail("StopSignalHandlers: cannot install a handler for SIG", stop_signal_name(signal));
    }
    saved_.push_back(saved);
  }
}

StopSignalHandlers::~StopSignalHandlers() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    sigaction(it->signal, &it->previous, nullptr);
  }
  g_installed = false;
}

int StopSignalHandlers::received() const {
  return g_stop_signal.load();
}

std::vector<TestSignal> test_signals_from_environment() {
  std::vector<TestSignal> signals;
  const char* spec = std::getenv("MPIGRAD_TEST_RAISE_SIGNAL");
  if (spec == nullptr || *spec == '\0') return signals;
  const std::string where = "MPIGRAD_TEST_RAISE_SIGNAL";
  for (const std::string& item : split(spec, ',')) {
    std::vector<std::string> parts = split(item, ':');
    MPIGRAD_CHECK(parts.size() == 3, where, ": '", item, "' is not RANK:STEP:SIGNAL");
    TestSignal test{};
    try {
      test.rank = std::stoi(parts[0]);
      test.step = parts[1] == "stop" ? -1 : std::stoll(parts[1]);
    } catch (const std::exception&) {
      core::fail(where, ": '", item, "': RANK and STEP must be integers (STEP may be 'stop')");
    }
    std::vector<int> signal = parse_stop_signals(parts[2], where);
    MPIGRAD_CHECK(signal.size() == 1, where, ": '", item, "' names no signal");
    test.signal = signal[0];
    signals.push_back(test);
  }
  return signals;
}

}  // namespace mpigrad::launch
