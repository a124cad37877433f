// Keeps a job from hanging in a collective. Each communicator numbers its collectives (every rank
// starts them in the same order, so collective #7 is the same operation everywhere) and tells
// its watchdog when a rank starts one and when it blocks waiting for one.
//
// A background thread per communicator wakes every few tens of milliseconds. If this rank has
// been blocked in one collective for longer than the timeout, it asks every other rank, over a
// separate control communicator, where it is; their watchdog threads answer even while their
// main thread sleeps, computes, or is stuck elsewhere. The report names the operation, its
// sequence number and size, and the ranks that have not arrived (with where they are, and their
// hosts), then MPI_Abort ends the job with a non-zero exit (abort_job in mpi_handle.h, which also
// covers mpirun --enable-recovery).
//
// What a rank that has not arrived is reported as:
// - "gone (no answer ...)": it did not answer; only a process that died or exited, or a node
//   that cannot be reached, stays silent.
// - "alive, waiting in OP #k on communicator 'NAME' for N ms, on rank R on HOST (gone), ...":
//   one such clause per collective the process is blocked in, on any of its communicators (a
//   rank asked over the world may be blocked in the inter-node group, or in DDP's communication
//   thread's communicator), because every watchdog of a process answers for all of them from one
//   process-wide registry. Whom it waits for is known on the asking communicator from the
//   answers themselves; on another one, from a probe: a watchdog whose rank has waited a quarter
//   of the timeout asks its own communicator's ranks once which of them have not started that
//   collective, and keeps the answer for such reports (the clause has no "on ..." before that).
//   A collective of that process pending on a GPU stream (QueuedCollectives below) reads
//   "waiting in OP #k on communicator 'NAME' (queued on the GPU) for N ms".
// - "alive, not in a collective; has started n collectives (needs k)".
// Every rank in the report is a rank of mpigrad's world (WorldRanks, communicator.h), this one
// with its host, never a rank of the sub-communicator: an inter-node group of world ranks 1 and
// 3 reports 1 and 3, not 0 and 1.
//
// Asking other ranks while the main thread is inside MPI needs MPI_THREAD_MULTIPLE. With less,
// the watchdog still aborts on timeout but reports only what this rank knows.
//
// Cost on the hot path: next_sequence() is one atomic increment, begin_wait()/end_wait() a few
// relaxed atomic stores; no MPI call, no lock, no clock read. The registry is locked only when a
// watchdog is created or destroyed and when one answers a query.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mpigrad::launch {

struct MpiCommHandle;
struct WorldRanks;

// Collectives queued on a GPU stream, which the host may never wait for (NCCL's are stream-ordered,
// nccl_communicator.h): a rank whose peer never arrives then hangs in whatever synchronizes the
// device next, outside any WaitScope. The watchdog thread asks, every poll, for the oldest one not
// complete, and times it from when it first sees it pending, like a host wait. After the report
// of any timeout on a communicator that has them, abort() stops them (ncclCommAbort), so that no
// GPU kernel keeps waiting for the missing ranks while the job is ended.
class QueuedCollectives {
 public:
  struct Pending {
    uint64_t sequence = 0;
    const char* op = "";  // a string literal
    int64_t bytes = 0;
    std::string error;  // what the library reports for it, if anything (ncclCommGetAsyncError)
  };
  virtual ~QueuedCollectives() = default;
  // From the watchdog thread: the oldest queued collective not yet complete; false if none.
  virtual bool oldest_pending(Pending& pending) = 0;
  // From the watchdog thread, after the report; the call it makes, for the report's last line.
  virtual void abort() = 0;
  virtual const char* abort_call() const = 0;
};

class CollectiveWatchdog {
 public:
  // `control` must be a communicator over the same ranks used for nothing but the watchdog (and
  // debug checks), and must outlive the watchdog; `world` places its ranks in mpigrad's world.
  CollectiveWatchdog(const MpiCommHandle& control, std::string name,
                     std::shared_ptr<const WorldRanks> world, double timeout_seconds,
                     bool can_query_ranks);
  ~CollectiveWatchdog();  // stops and joins the thread
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Called when this rank starts a collective; returns its sequence number (0, 1, 2, ...).
  uint64_t next_sequence();
  uint64_t started() const;

  // Watches `queued` (null: stop watching) from now on; it must stay valid until replaced. Waits
  // for the watchdog thread to finish its current poll, so that once this returns with null the
  // thread no longer touches the old one.
  void watch_queued(QueuedCollectives* queued);

  // Brackets the time this rank blocks for collective `sequence`; `op` must be a string literal.
  void begin_wait(uint64_t sequence, const char* op, int64_t bytes);
  void end_wait();

  class WaitScope {
   public:
    WaitScope(CollectiveWatchdog& watchdog, uint64_t sequence, const char* op, int64_t bytes)
        : watchdog_(watchdog) {
      watchdog_.begin_wait(sequence, op, bytes);
    }
    ~WaitScope() { watchdog_.end_wait(); }
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    CollectiveWatchdog& watchdog_;
  };

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpigrad::launch
