// NcclCommunicator: MPI-bootstrapped NCCL communicators, stream ordering with events, the dtypes
// NCCL moves (Communicator has checked the rest), and the NCCL call behind each collective.
// Compiled only with the CUDA backend.
#include "mpigrad/launch/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda/cuda_check.cuh"
#include "mpigrad/core/cuda_allocator.h"
#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/collective_check.h"
#include "mpigrad/launch/comm/collective_watchdog.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

// Members are declared in reverse order of destruction for the MPI side (the runtime goes last);
// the NCCL and CUDA handles are released explicitly in the destructor, NCCL first.
struct NcclCommunicator::State {
  std::shared_ptr<MpiRuntime> runtime;  // destroyed last: MPI outlives the communicators
  MpiCommHandle comm;                   // unique-id exchange and splits
  MpiCommHandle control;                // watchdog queries and debug checks only
  std::unique_ptr<CollectiveWatchdog> watchdog;
  std::string name;
  int rank = 0;
  int size = 1;
  std::shared_ptr<const WorldRanks> world;  // this communicator's ranks in mpigrad's world
  int world_rank = 0;
  core::Device device = core::cuda(0);
  CollectiveConfig config;

  cudaStream_t stream = nullptr;    // every NCCL call of this communicator
  cudaEvent_t ready = nullptr;      // caller's stream -> NCCL stream, re-recorded per call
  float* barrier_buffer = nullptr;  // one device float for barrier()
  ncclComm_t nccl = nullptr;
  bool broken = false;  // a NCCL call failed: abort the communicator instead of destroying it

  // The communicator is non-blocking (ncclConfig_t.blocking = 0): every call returns at once, and
  // the watchdog thread can abort it while this rank's main thread waits on the GPU. `calls` is
  // held around every NCCL call of the main thread and around that abort, so the abort never
  // frees the communicator under a call; once `aborted`, the main thread makes no NCCL call
  // again and waits for the watchdog to end the job.
  std::mutex calls;
  std::atomic<bool> aborted{false};

  // The last kTracked collectives queued, each with an event recorded after it on `stream`, for
  // the watchdog (QueuedCollectives, collective_watchdog.h). The main thread fills slot
  // n % kTracked, records its event, then counts it in `tracked_count`; the watchdog thread
  // queries them oldest first. Atomics, since a slot can be refilled while the watchdog reads it
  // (after kTracked more collectives, when it reads an older one that has completed anyway).
  struct TrackedCollective {
    cudaEvent_t done = nullptr;
    std::atomic<uint64_t> seq{0};
    std::atomic<const char*> op{""};
    std::atomic<int64_t> bytes{0};
  };
  static constexpr uint64_t kTracked = 64;
  std::array<TrackedCollective, kTracked> tracked;
  std::atomic<uint64_t> tracked_count{0};
  uint64_t tracked_complete = 0;  // watchdog thread only: how many it has seen complete
  std::unique_ptr<QueuedCollectives> queued_view;  // what the watchdog watches

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    // The watchdog stops looking at the tracked events before they go.
    if (watchdog) watchdog->watch_queued(nullptr);
    int previous = -1;
    const bool switched =
        core::cuda_detail::make_home_device_current(device.index) == cudaSuccess &&
        cudaGetDevice(&previous) == cudaSuccess && previous != device.index &&
        cudaSetDevice(device.index) == cudaSuccess;
    if (nccl != nullptr && !aborted.load()) {
      std::lock_guard<std::mutex> lock(calls);
      // ncclCommDestroy waits until every rank's operations have drained; while an exception
      // unwinds, the other ranks may never get there, so abort instead of hanging.
      bool abort = broken || std::uncaught_exceptions() > 0;
      // Nor can it destroy a communicator with an asynchronous error no call has raised yet (a
      // peer lost after the last check): NCCL's ncclCommDestroy then returns that error from
      // inside the group it opened (init.cc, ncclCommEnsureReady), leaking the communicator and
      // leaving this thread's later NCCL calls in an unclosed group. Abort that one too.
      ncclResult_t pending = ncclSuccess;
      if (!abort &&
          (ncclCommGetAsyncError(nccl, &pending) != ncclSuccess || pending != ncclSuccess)) {
        abort = true;
      }
      ncclResult_t result = abort ? ncclCommAbort(nccl) : ncclCommDestroy(nccl);
      if (result != ncclSuccess) {
        std::fprintf(stderr, "%s mpigrad: %s on NCCL communicator '%s' failed: %s\n",
                     label().c_str(), abort ? "ncclCommAbort" : "ncclCommDestroy", name.c_str(),
                     ncclGetErrorString(result));
      }
      nccl = nullptr;
    }
    if (barrier_buffer != nullptr) (void)cudaFree(barrier_buffer);
    for (TrackedCollective& slot : tracked) {
      if (slot.done != nullptr) (void)cudaEventDestroy(slot.done);
    }
    if (ready != nullptr) (void)cudaEventDestroy(ready);
    // The stream is synchronized but never destroyed: the caching allocator may still hold
    // blocks used on it (gradient buckets live as long as the model, which can outlive this
    // communicator) and records events on it when they are freed. One stream per communicator
    // for the life of the process is what that costs, as in PyTorch's stream pool.
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    if (switched) (void)cudaSetDevice(previous);
    watchdog.reset();  // its thread uses `control`, which the members' destructors free next
  }

  // "[rank r/w]" in world numbers; before the world ranks are known, the communicator's own.
  std::string label() const {
    return world ? rank_label(world_rank, world->size) : rank_label(rank, size);
  }
  // What every message starts with. A failed NCCL call may be a peer on another node that is
  // gone, so those name this rank's host too.
  std::string where(bool on_host = false) const {
    const std::string at = world && on_host ? rank_label_on_host(world_rank, world->size) : label();
    return at + " NCCL communicator '" + name + "' (" + device.str() + ")";
  }
};

namespace {

using State = NcclCommunicator::State;

[[noreturn]] void fail_nccl(State& state, ncclResult_t result, const char* call) {
  if (result != ncclInProgress) state.broken = true;
  const char* last = ncclGetLastError(state.nccl);
  core::fail(state.where(/*on_host=*/true), ": ", call, " failed: ", ncclGetErrorString(result),
             last != nullptr && *last ? std::string(" (") + last + ")" : std::string());
}

[[noreturn]] void fail_cuda(const State& state, cudaError_t status, const char* call) {
  (void)cudaGetLastError();  // clear a sticky-free error so later queries start clean
  core::fail(state.where(), ": CUDA call ", call, " failed: ", cudaGetErrorName(status), " (",
             cudaGetErrorString(status), ")");
}

inline void check_nccl(State& state, ncclResult_t result, const char* call) {
  if (result != ncclSuccess) [[unlikely]]
    fail_nccl(state, result, call);
}

inline void check_cuda(const State& state, cudaError_t status, const char* call) {
  if (status != cudaSuccess) [[unlikely]]
    fail_cuda(state, status, call);
}

// The watchdog aborted the communicator after its report (collective_watchdog.h) and is ending
// the job; one report is the whole story, so the main thread adds no error of its own.
[[noreturn]] void wait_for_the_job_to_end() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Takes the call lock; returns only while the communicator has not been aborted.
std::unique_lock<std::mutex> lock_calls(State& state) {
  std::unique_lock<std::mutex> lock(state.calls);
  if (state.aborted.load(std::memory_order_acquire)) [[unlikely]]
    wait_for_the_job_to_end();
  return lock;
}

// The collective a call belongs to, for the watchdog.
struct Watched {
  uint64_t seq = 0;
  const char* op = "";
  int64_t bytes = 0;
};

// A non-blocking communicator may answer ncclInProgress: the call (initialization, or queuing a
// collective, whose first use connects to the peers) has not finished yet, and
// ncclCommGetAsyncError says when it has. Polls until then, releasing the lock in between so
// that the watchdog can abort a hung one. The host waits for the peers here, so the wait is
// watched as collective `watched` (null: the caller watches it already).
void complete_nccl(State& state, std::unique_lock<std::mutex>& lock, ncclResult_t result,
                   const char* call, const Watched* watched) {
  if (result == ncclInProgress && watched != nullptr) {
    CollectiveWatchdog::WaitScope wait(*state.watchdog, watched->seq, watched->op, watched->bytes);
    complete_nccl(state, lock, result, call, nullptr);
    return;
  }
  while (result == ncclInProgress) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
    if (state.aborted.load(std::memory_order_acquire)) wait_for_the_job_to_end();
    ncclResult_t status = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(state.nccl, &status);
    result = query != ncclSuccess ? query : status;
  }
  check_nccl(state, result, call);
}

// NCCL reports a failed peer, a network error or a mismatch asynchronously; the stream-ordered
// Work would otherwise never notice and a later host sync would hang.
void check_async_error(State& state) {
  auto lock = lock_calls(state);
  ncclResult_t async_error = ncclSuccess;
  check_nccl(state, ncclCommGetAsyncError(state.nccl, &async_error), "ncclCommGetAsyncError");
  if (async_error != ncclSuccess && async_error != ncclInProgress) {
    fail_nccl(state, async_error, "a collective (asynchronous NCCL error)");
  }
}

// Makes the communicator's device current for a scope; skips cudaSetDevice when it already is.
// A thread's first CUDA call goes to the process's home device first (core/cuda.h), so the
// device restored afterwards is that one, never CUDA's default cuda:0.
class DeviceScope {
 public:
  explicit DeviceScope(const State& state) {
    check_cuda(state, core::cuda_detail::make_home_device_current(state.device.index),
               "cudaSetDevice (the process's home device)");
    check_cuda(state, cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != state.device.index) {
      check_cuda(state, cudaSetDevice(state.device.index), "cudaSetDevice");
      changed_ = true;
    }
  }
  ~DeviceScope() {
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

using Kind = CollectiveKind;

ncclDataType_t nccl_type(core::DType dtype) {
  switch (dtype) {
    case core::DType::Float32:
      return ncclFloat32;
    case core::DType::Float64:
      return ncclFloat64;
    case core::DType::BFloat16:
      return ncclBfloat16;
    case core::DType::Float16:
      return ncclFloat16;
    case core::DType::Int32:
      return ncclInt32;
    case core::DType::Int64:
      return ncclInt64;
    case core::DType::UInt8:
      return ncclUint8;
    default:
      break;
  }
  core::fail("the nccl backend does not move ", core::dtype_name(dtype),
             " tensors (float32, float64, bfloat16, float16, int32, int64, uint8)");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

// The one argument check of NCCL's own (Communicator has made the others): the dtypes it moves.
void check_dtype(const State& state, const Collective& collective) {
  try {
    (void)nccl_type(collective.dtype);
  } catch (const core::Error& error) {
    core::fail(state.where(), ": ", collective_kind_name(collective.kind), ": ", error.what());
  }
}

char* byte_ptr(const core::Tensor& tensor) {
  return static_cast<char*>(tensor.data_ptr());
}

// Several point-to-point NCCL calls as one operation (ncclGroupStart/ncclGroupEnd), so NCCL
// schedules them together. `calls(note)` queues them, passing each result to note(result, name).
// The group is closed even after a failed call, so the communicator is left consistent.
template <typename Calls>
void issue_group(State& s, std::unique_lock<std::mutex>& lock, const Watched& watched,
                 Calls&& calls) {
  check_nccl(s, ncclGroupStart(), "ncclGroupStart");
  ncclResult_t first_error = ncclSuccess;
  const char* failed_call = "";
  calls([&](ncclResult_t result, const char* call) {
    if (result != ncclSuccess && first_error == ncclSuccess) {
      first_error = result;
      failed_call = call;
    }
  });
  const ncclResult_t end = ncclGroupEnd();
  if (first_error != ncclSuccess) fail_nccl(s, first_error, failed_call);
  complete_nccl(s, lock, end, "ncclGroupEnd", &watched);
}

// The NCCL calls of one collective, on the communicator's stream. Zero-element operations queue
// nothing: every rank passes the same counts, so every rank skips the same calls.
void issue(State& s, const Collective& c, uint64_t seq, std::unique_lock<std::mutex>& lock) {
  const ncclDataType_t type = nccl_type(c.dtype);
  const Watched watched{seq, collective_kind_name(c.kind), c.bytes};
  const size_t count = size_t(c.count);
  const size_t element = core::element_size(c.dtype);
  switch (c.kind) {
    case Kind::AllReduce:
      if (count == 0) return;
      complete_nccl(s, lock,
                    ncclAllReduce(c.input->data_ptr(), c.output->data_ptr(), count, type,
                                  nccl_op(c.op), s.nccl, s.stream),
                    "ncclAllReduce", &watched);
      return;
    case Kind::Broadcast:
      if (count == 0) return;
      complete_nccl(s, lock,
                    ncclBroadcast(c.output->data_ptr(), c.output->data_ptr(), count, type, c.root,
                                  s.nccl, s.stream),
                    "ncclBroadcast", &watched);
      return;
    case Kind::AllGather:
      if (count == 0) return;
      complete_nccl(
          s, lock,
          ncclAllGather(c.input->data_ptr(), c.output->data_ptr(), count, type, s.nccl, s.stream),
          "ncclAllGather", &watched);
      return;
    case Kind::ReduceScatter:
      if (count == 0) return;
      complete_nccl(s, lock,
                    ncclReduceScatter(c.input->data_ptr(), c.output->data_ptr(), count, type,
                                      nccl_op(c.op), s.nccl, s.stream),
                    "ncclReduceScatter", &watched);
      return;
    case Kind::AllGatherV:
      // One broadcast per contributing rank into its slice of the output. The root reads its own
      // input (which may already be its slice of the output: NCCL allows sendbuff == recvbuff).
      issue_group(s, lock, watched, [&](auto&& note) {
        for (int r = 0; r < s.size; ++r) {
          const size_t n = size_t(c.count_of(r));
          if (n == 0) continue;
          char* slice = byte_ptr(*c.output) + size_t(c.offset_of(r)) * element;
          const void* send = r == s.rank ? c.input->data_ptr() : slice;
          note(ncclBroadcast(send, slice, n, type, r, s.nccl, s.stream),
               "ncclBroadcast (all_gather_v)");
        }
      });
      return;
    case Kind::Gather:
    case Kind::GatherV:
      // NCCL has no gather: every other rank sends its input to the root, which receives each
      // into its slice of the output and copies its own (unless it is already there).
      if (s.rank == c.root && !c.in_place && count > 0) {
        check_cuda(s,
                   cudaMemcpyAsync(byte_ptr(*c.output) + size_t(c.offset_of(s.rank)) * element,
                                   c.input->data_ptr(), count * element, cudaMemcpyDeviceToDevice,
                                   s.stream),
                   "cudaMemcpyAsync (the root's own block of a gather)");
      }
      issue_group(s, lock, watched, [&](auto&& note) {
        if (s.rank != c.root) {
          if (count > 0) {
            note(ncclSend(c.input->data_ptr(), count, type, c.root, s.nccl, s.stream),
                 "ncclSend (gather)");
          }
          return;
        }
        for (int r = 0; r < s.size; ++r) {
          const size_t n = size_t(c.count_of(r));
          if (r == s.rank || n == 0) continue;
          note(ncclRecv(byte_ptr(*c.output) + size_t(c.offset_of(r)) * element, n, type, r, s.nccl,
                        s.stream),
               "ncclRecv (gather)");
        }
      });
      return;
    case Kind::Barrier:
      complete_nccl(s, lock,
                    ncclAllReduce(s.barrier_buffer, s.barrier_buffer, 1, ncclFloat32, ncclSum,
                                  s.nccl, s.stream),
                    "ncclAllReduce (barrier)", &watched);
      return;
  }
}

// Tells the caching allocator that the NCCL stream uses the tensor's block. Memory the allocator
// does not own (a Storage wrapping external device memory) is its owner's to keep alive until
// the collective has finished; record_stream refuses it, and that refusal is not an error here.
void announce(const State& s, const core::Tensor* tensor) {
  if (tensor == nullptr || tensor->numel() == 0) return;
  try {
    core::record_stream(*tensor, core::StreamView(s.device, s.stream));
  } catch (const core::Error&) {
  }
}

// Marks the end of collective `seq` on the NCCL stream for the watchdog (one event record), and
// returns that event, which the blocking forms make the caller's stream wait for (a wait takes
// the event's record at the time of the call, so refilling the slot later changes nothing).
cudaEvent_t track(State& s, uint64_t seq, const char* op, int64_t bytes) {
  const uint64_t n = s.tracked_count.load(std::memory_order_relaxed);
  State::TrackedCollective& slot = s.tracked[n % State::kTracked];
  slot.seq.store(seq, std::memory_order_relaxed);
  slot.op.store(op, std::memory_order_relaxed);
  slot.bytes.store(bytes, std::memory_order_relaxed);
  check_cuda(s, cudaEventRecord(slot.done, s.stream), "cudaEventRecord (collective timeout)");
  s.tracked_count.store(n + 1, std::memory_order_release);
  return slot.done;
}

// What the watchdog sees of the collectives queued on the GPU.
class NcclQueuedCollectives final : public QueuedCollectives {
 public:
  explicit NcclQueuedCollectives(State& state) : state_(state) {}

  bool oldest_pending(Pending& pending) override {
    State& s = state_;
    // The watchdog's thread makes no other CUDA call: home device first, then this one's.
    if (!device_set_) {
      device_set_ = core::cuda_detail::make_home_device_current(s.device.index) == cudaSuccess &&
                    cudaSetDevice(s.device.index) == cudaSuccess;
      if (!device_set_) return false;
    }
    const uint64_t count = s.tracked_count.load(std::memory_order_acquire);
    if (count - s.tracked_complete > State::kTracked) s.tracked_complete = count - State::kTracked;
    for (; s.tracked_complete < count; ++s.tracked_complete) {
      State::TrackedCollective& slot = s.tracked[s.tracked_complete % State::kTracked];
      const cudaError_t status = cudaEventQuery(slot.done);
      if (status == cudaErrorNotReady) {
        pending.sequence = slot.seq.load(std::memory_order_relaxed);
        pending.op = slot.op.load(std::memory_order_relaxed);
        pending.bytes = slot.bytes.load(std::memory_order_relaxed);
        pending.error = async_error();
        return true;
      }
      // Complete, or failed: a CUDA error there is the main thread's to raise.
      if (status != cudaSuccess) (void)cudaGetLastError();
    }
    return false;
  }

  void abort() override {
    State& s = state_;
    std::lock_guard<std::mutex> lock(s.calls);
    if (s.aborted.load() || s.nccl == nullptr) return;
    s.aborted.store(true, std::memory_order_release);
    const ncclResult_t result = ncclCommAbort(s.nccl);
    if (result != ncclSuccess) {
      std::fprintf(stderr, "%s ncclCommAbort failed: %s\n", s.where(true).c_str(),
                   ncclGetErrorString(result));
    }
  }

  const char* abort_call() const override { return "ncclCommAbort"; }

 private:
  // NCCL's asynchronous error, if any, in words; never waits for the main thread's call lock.
  std::string async_error() {
    State& s = state_;
    std::unique_lock<std::mutex> lock(s.calls, std::try_to_lock);
    if (!lock.owns_lock() || s.aborted.load() || s.nccl == nullptr) return "";
    ncclResult_t status = ncclSuccess;
    if (ncclCommGetAsyncError(s.nccl, &status) != ncclSuccess) return "";
    if (status == ncclSuccess || status == ncclInProgress) return "";
    return std::string("NCCL reports ") + ncclGetErrorString(status);
  }

  State& state_;
  bool device_set_ = false;
};

// Numbers the collective, orders it after the caller's stream, announces its buffers to the
// allocator, queues it, and marks its end for the watchdog.
struct Queued {
  cudaStream_t caller = nullptr;
  uint64_t seq = 0;
  cudaEvent_t done = nullptr;  // recorded after it on the NCCL stream
};

Queued enqueue(State& s, const Collective& call) {
  check_dtype(s, call);
  Queued queued;
  queued.seq = s.watchdog->next_sequence();
  if (s.config.debug_collectives) {
    check_collective_agreement(s.control, *s.world, s.where(), s.name, call, queued.seq);
  }
  queued.caller = static_cast<cudaStream_t>(core::current_stream(s.device).handle());
  check_cuda(s, cudaEventRecord(s.ready, queued.caller), "cudaEventRecord (caller's stream)");
  check_cuda(s, cudaStreamWaitEvent(s.stream, s.ready, 0), "cudaStreamWaitEvent (NCCL stream)");
  announce(s, call.input);
  announce(s, call.output);
  {
    auto lock = lock_calls(s);
    issue(s, call, queued.seq, lock);
  }
  queued.done = track(s, queued.seq, collective_kind_name(call.kind), call.bytes);
  return queued;
}

// The blocking form: queue, then make the caller's stream wait for the NCCL stream.
void run_blocking(State& s, const Collective& call) {
  DeviceScope scope(s);
  Queued queued = enqueue(s, call);
  check_cuda(s, cudaStreamWaitEvent(queued.caller, queued.done, 0),
             "cudaStreamWaitEvent (caller's stream)");
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, const Collective& call) : state_(std::move(state)) {
    if (call.input != nullptr) input_ = *call.input;
    if (call.output != nullptr) output_ = *call.output;
  }

  ~NcclWork() override {
    if (event_ == nullptr) return;
    if (!waited_) {
      try {
        wait();
      } catch (const std::exception& error) {
        std::fprintf(stderr, "%s\n", error.what());
      }
    }
    (void)cudaEventDestroy(event_);
  }

  // Marks the end of the collective on the NCCL stream. The event is created here, after the
  // NCCL calls were queued, so a failure before this point leaves nothing to clean up.
  void record() {
    State& s = *state_;
    check_cuda(s, cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    check_cuda(s, cudaEventRecord(event_, s.stream), "cudaEventRecord (NCCL stream)");
  }

  bool test() override {
    if (done_) return true;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      check_async_error(*state_);  // a failed peer or network shows here, not in the event
      return false;
    }
    check_cuda(*state_, status, "cudaEventQuery");
    done_ = true;
    return true;
  }

  // Stream-ordered (see nccl_communicator.h): the caller's current stream waits for the
  // collective; the host does not.
  void wait() override {
    if (waited_) return;
    State& s = *state_;
    check_async_error(s);
    DeviceScope scope(s);
    auto caller = static_cast<cudaStream_t>(core::current_stream(s.device).handle());
    check_cuda(s, cudaStreamWaitEvent(caller, event_, 0), "cudaStreamWaitEvent (caller's stream)");
    waited_ = true;
    // The allocator already knows the NCCL stream uses these buffers (record_stream), so they
    // can be released now without their memory being reused before the collective finishes.
    input_ = core::Tensor();
    output_ = core::Tensor();
  }

 private:
  std::shared_ptr<State> state_;
  core::Tensor input_, output_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
  bool waited_ = false;
};

WorkPtr start_async(const std::shared_ptr<State>& state, const Collective& call) {
  DeviceScope scope(*state);
  enqueue(*state, call);
  auto work = std::make_shared<NcclWork>(state, call);
  work->record();
  return work;
}

void ensure_barrier_buffer(State& s) {
  if (s.barrier_buffer != nullptr) return;
  DeviceScope scope(s);
  check_cuda(s, cudaMalloc(reinterpret_cast<void**>(&s.barrier_buffer), sizeof(float)),
             "cudaMalloc");
  check_cuda(s, cudaMemsetAsync(s.barrier_buffer, 0, sizeof(float), s.stream), "cudaMemsetAsync");
}

}  // namespace

// ---- NcclCommunicator ---------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(MpiCommHandle&& comm, std::shared_ptr<MpiRuntime> runtime,
                                   core::Device device, std::string name, CollectiveConfig config,
                                   std::shared_ptr<const WorldRanks> world)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.runtime = std::move(runtime);
  s.comm = std::move(comm);
  s.name = std::move(name);
  s.device = device;
  s.config = config;
  check_mpi(MPI_Comm_set_errhandler(s.comm.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
            s.name);
  check_mpi(MPI_Comm_rank(s.comm.comm, &s.rank), "MPI_Comm_rank", s.name);
  check_mpi(MPI_Comm_size(s.comm.comm, &s.size), "MPI_Comm_size", s.name);
  s.world = world ? std::move(world) : gather_world_ranks(s.comm.comm, s.name);
  MPIGRAD_CHECK(int(s.world->of_member.size()) == s.size, "NcclCommunicator '", s.name,
                "': world ranks for ", s.world->of_member.size(), " ranks, but it has ", s.size);
  s.world_rank = s.world->of_member[size_t(s.rank)];
  place_in_world(s.world);

  // Every rank checks its device before anything collective, and all learn whether some rank
  // failed, so a rank without a GPU makes every rank throw instead of leaving the others waiting
  // in the unique-id broadcast.
  std::string problem;
  const int visible = core::cuda_device_count();
  if (!device.is_cuda()) {
    problem = device.str() + " is not a CUDA device";
  } else if (visible == 0) {
    problem = "no CUDA device is visible";
  } else if (device.index < 0 || device.index >= visible) {
    problem =
        device.str() + " is not available (" + std::to_string(visible) + " CUDA device(s) visible)";
  }
  int bad = problem.empty() ? 0 : 1, any_bad = 0;
  check_mpi(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, s.comm.comm), "MPI_Allreduce",
            "device check of NCCL communicator '" + s.name + "'", s.label());
  MPIGRAD_CHECK(bad == 0, s.where(), ": cannot create: ", problem);
  MPIGRAD_CHECK(any_bad == 0, s.where(), ": cannot create: another rank has no usable CUDA device");

  s.control =
      duplicate_communicator(s.comm.comm, "control communicator of '" + s.name + "'", s.label());
  s.watchdog =
      std::make_unique<CollectiveWatchdog>(s.control, s.name, s.world, config.timeout_seconds,
                                           s.runtime->thread_level() == ThreadLevel::Multiple);

  DeviceScope scope(s);
  check_cuda(s, cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags");
  check_cuda(s, cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming),
             "cudaEventCreateWithFlags");

  // Rank 0's unique id, with its status, so that a failure there fails every rank.
  struct Packet {
    int32_t status = ncclSuccess;
    ncclUniqueId id;
  } packet;
  std::memset(&packet.id, 0, sizeof(packet.id));
  if (s.rank == 0) packet.status = int32_t(ncclGetUniqueId(&packet.id));
  check_mpi(MPI_Bcast(&packet, int(sizeof(packet)), MPI_BYTE, 0, s.comm.comm), "MPI_Bcast",
            "ncclUniqueId of '" + s.name + "'", s.label());
  if (packet.status != ncclSuccess) {
    core::fail(s.where(), ": ncclGetUniqueId failed on rank ", s.world->of_member[0],
               " (rank 0 of this communicator): ", ncclGetErrorString(ncclResult_t(packet.status)));
  }
  // Initialization is collective: watched like one, so a rank that never arrives ends the job.
  const uint64_t seq = s.watchdog->next_sequence();
  {
    CollectiveWatchdog::WaitScope wait(*s.watchdog, seq, "ncclCommInitRank", 0);
    ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
    nccl_config.blocking = 0;  // see State::calls
    auto lock = lock_calls(s);
    complete_nccl(s, lock, ncclCommInitRankConfig(&s.nccl, s.size, packet.id, s.rank, &nccl_config),
                  "ncclCommInitRankConfig", nullptr);
  }
  for (State::TrackedCollective& slot : s.tracked) {
    check_cuda(s, cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
  }
  s.queued_view = std::make_unique<NcclQueuedCollectives>(s);
  s.watchdog->watch_queued(s.queued_view.get());
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const {
  return state_->rank;
}
int NcclCommunicator::size() const {
  return state_->size;
}
const std::string& NcclCommunicator::name() const {
  return state_->name;
}
core::Device NcclCommunicator::device() const {
  return state_->device;
}
core::StreamView NcclCommunicator::stream() const {
  return core::StreamView(state_->device, state_->stream);
}
void* NcclCommunicator::native_handle() const {
  return state_->nccl;
}
uint64_t NcclCommunicator::collectives_started() const {
  return state_->watchdog->started();
}

WorkPtr NcclCommunicator::start_collective(const Collective& collective) {
  if (collective.kind == Kind::Barrier) ensure_barrier_buffer(*state_);
  return start_async(state_, collective);
}

void NcclCommunicator::run_collective(const Collective& collective) {
  State& s = *state_;
  if (collective.kind != Kind::Barrier) {
    run_blocking(s, collective);
    return;
  }
  ensure_barrier_buffer(s);
  DeviceScope scope(s);
  Queued queued = enqueue(s, collective);
  // The host waits here, so the wait is watched: polling the stream keeps the watchdog's view of
  // "blocked in collective #seq" accurate, and a rank that never arrives ends the job.
  CollectiveWatchdog::WaitScope wait(*s.watchdog, queued.seq, "barrier", 4);
  while (true) {
    const cudaError_t status = cudaStreamQuery(s.stream);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) fail_cuda(s, status, "cudaStreamQuery (barrier)");
    check_async_error(s);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
  State& s = *state_;
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(s.comm.comm, color < 0 ? MPI_UNDEFINED : color, key, &part),
            "MPI_Comm_split", "NCCL communicator '" + s.name + "' into '" + name + "'", s.label());
  if (part == MPI_COMM_NULL) return nullptr;
  MpiCommHandle handle(part);
  auto world = world_ranks_within(part, s.comm.comm, *s.world);
  return std::make_unique<NcclCommunicator>(std::move(handle), s.runtime, s.device, std::move(name),
                                            s.config, std::move(world));
}

std::unique_ptr<Communicator> NcclCommunicator::split_node_local(std::string name) {
  State& s = *state_;
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(s.comm.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &part),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", "NCCL communicator '" + s.name + "'",
            s.label());
  MpiCommHandle handle(part);
  auto world = world_ranks_within(part, s.comm.comm, *s.world);
  return std::make_unique<NcclCommunicator>(std::move(handle), s.runtime, s.device, std::move(name),
                                            s.config, std::move(world));
}

}  // namespace mpigrad::launch
