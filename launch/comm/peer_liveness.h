// Naming a lost rank. When a process of the job dies, Open MPI's mpirun ends the others (SIGCONT,
// then SIGTERM a second later, then SIGKILL), and all a survivor printed was mpirun's own message
// ("process rank 1 ... exited on signal 9"). MPI itself cannot say who is gone at that moment: the
// TCP transport's report of the broken connection blocks whichever thread runs MPI's progress
// until the launcher reads it, and the launcher is busy ending the job.
//
// So the ranks of the world hold a ring of plain TCP connections of their own beside MPI: each
// rank connects to the next (rank r to r + 1 mod N) and accepts the previous one. The kernel
// closes a dead process's sockets at once, so its two neighbours see the connection end without
// the goodbye a rank sends when it leaves normally (or aborts the job itself), and pass "rank k is
// lost" on around the ring, where the other ranks learn it within milliseconds. Nothing is printed
// then: a launcher's SIGCONT or SIGTERM (notice_termination_signal) makes this rank print one line
// naming the lost rank and its host, "[rank 0/4 on node0] mpigrad: rank 3 on node1 is gone (its
// connection ended without a goodbye: the process died); ...", and end at once, since no
// collective can complete now. A signal with no rank lost (a stop, job control) changes nothing.
// Under mpirun --enable-recovery no signal comes, and the collective watchdog's report names the
// gone rank as before (collective_watchdog.h).
//
// A node that drops off the network closes nothing; the watchdog's timeout covers that. Where
// the ring cannot be built (no address of one rank reachable from the previous one within a few
// seconds, say), it is not, and nothing else changes.
#pragma once

#include <memory>
#include <vector>

namespace mpigrad::launch {

class Communicator;

class PeerLiveness {
 public:
  // Collective over `world` (its ranks are mpigrad's world ranks, with their hosts): each rank
  // listens, the addresses are all-gathered, and a thread of this rank connects to the next rank
  // and accepts the previous one, then watches both. One per process at a time; a second is
  // refused (null) and the first goes on.
  static std::unique_ptr<PeerLiveness> start(Communicator& world);
  // Says goodbye to both neighbours (they must not take this rank for lost) and stops.
  ~PeerLiveness();
  PeerLiveness(const PeerLiveness&) = delete;
  PeerLiveness& operator=(const PeerLiveness&) = delete;

  // The lost ranks known here (world ranks), in the order learnt.
  std::vector<int> lost() const;

  struct Impl;

 private:
  explicit PeerLiveness(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// From a signal handler (async-signal-safe): this process got `signal` (SIGCONT or SIGTERM from a
// launcher ending the job). The ring's thread then prints the lost rank, if any, and ends this
// process (with SIGTERM's default action); with none lost, it ends it only with `end_process`
// (the handler stood in for that default; a stop handler that saves a checkpoint passes false).
// Returns false when no ring is running: the caller must act on the signal itself.
bool notice_termination_signal(int signal, bool end_process);

// The goodbye of ~PeerLiveness, for a rank about to end the job itself (abort_job): its
// neighbours must not report it as lost. Safe to call with no ring.
void say_goodbye_to_peers();

}  // namespace mpigrad::launch
