// The handle an asynchronous collective returns. The operation is already in flight when the
// handle exists; the caller computes, then calls wait() (or polls test()) before touching the
// output. The handle keeps the tensors it reads and writes alive until the operation completes,
// so a caller cannot free a buffer under a running collective by dropping its last reference.
//
// Destroying a Work that was never waited on still waits for it (a collective cannot be
// cancelled, and its buffers must outlive it), subject to the same timeout as wait().
#pragma once

#include <memory>

namespace mpigrad::launch {

class Work {
 public:
  virtual ~Work() = default;
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Drives the operation forward and returns true once it has completed (including any
  // finishing step such as the division of an average). Never blocks.
  virtual bool test() = 0;
  // Blocks until completion. For NCCL (NcclCommunicator) wait() is stream-ordered instead: the
  // caller's current CUDA stream waits for the collective and the host returns at once; test()
  // queries the collective's event. Past the communicator's timeout the job is aborted with a
  // report of which ranks have not arrived; it never hangs.
  virtual void wait() = 0;
  // wait() for a thread that must not spin a core the computation needs: polls test() with
  // short naps instead of blocking inside the communication library, which busy-polls (Open
  // MPI's MPI_Wait does). Same timeout and report as wait(). HierarchicalAllReduce's
  // communication thread waits this way (measured there). By default the same as wait().
  virtual void wait_sleeping() { wait(); }
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace mpigrad::launch
