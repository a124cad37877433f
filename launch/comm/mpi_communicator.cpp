// MpiCommunicator: argument checks, the debug agreement check, and the blocking and nonblocking
// MPI calls behind each collective.
#include "mpigrad/launch/comm/mpi_communicator.h"

#include <array>
#include <climits>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/kernels/dtype.h"
#include "mpigrad/launch/comm/collective_check.h"
#include "mpigrad/launch/comm/collective_watchdog.h"
#include "mpigrad/launch/comm/mpi_handle.h"

namespace mpigrad::launch {

struct MpiCommunicator::State {
  std::shared_ptr<MpiRuntime> runtime;  // destroyed last: MPI outlives the communicators
  MpiCommHandle comm;                   // the collectives' traffic
  MpiCommHandle control;                // watchdog queries and debug checks only
  std::string name;
  int rank = 0;
  int size = 1;
  CollectiveConfig config;
  // Each dtype's MPI datatype and reduction operators, looked up once at construction so a
  // call does not (MPI_OP_NULL: not supported; the slow path says why).
  std::array<MPI_Datatype, kernels::kNumDTypes> types{};
  std::array<std::array<MPI_Op, 4>, kernels::kNumDTypes> ops{};
  std::unique_ptr<CollectiveWatchdog> watchdog;  // destroyed first: its thread uses `control`

  ~State() { watchdog.reset(); }
};

namespace {

using Kind = CollectiveKind;

// One collective, checked and translated to MPI arguments.
struct Call {
  Kind kind = Kind::Barrier;
  // Borrowed: the caller's tensors for a blocking call, the Work's own copies for an async one
  // (the Work keeps them alive until completion). Pointers, not copies, keep the blocking path
  // free of reference-count traffic.
  const core::Tensor* input = nullptr;
  const core::Tensor* output = nullptr;
  core::DType dtype = core::kFloat32;
  MPI_Datatype type = MPI_BYTE;
  MPI_Op mpi_op = MPI_SUM;
  ReduceOp reduce = ReduceOp::Sum;
  int count = 0;  // all_reduce/broadcast: elements; all_gather: per rank; reduce_scatter: per rank
  int root = 0;
  bool in_place = false;
  std::vector<int> counts, displs;  // all_gather_v
  int64_t bytes = 0;                // what this rank moves, for reports

  // all_reduce fills these once (its per-call path is the latency-bound one); other calls ask
  // the tensors.
  const void* send_data = nullptr;
  void* recv_data = nullptr;
  const void* send() const {
    if (in_place) return MPI_IN_PLACE;
    return send_data != nullptr ? send_data : input->data_ptr();
  }
  void* recv() const { return recv_data != nullptr ? recv_data : output->data_ptr(); }
};

int to_int_count(int64_t count, const char* op, const std::string& name) {
  MPIGRAD_CHECK(count <= INT_MAX, op, " on communicator '", name, "': ", count,
                " elements exceed MPI's int count limit (", INT_MAX, "); split the tensor");
  return int(count);
}

// The argument checks run on every call, so the messages are built only on failure, in code
// kept off the fast path (measured with perf on an 8-byte all-reduce: the inline checks and
// their message set-up were a third of mpigrad's 130 ns over raw MPI_Allreduce).
[[noreturn, gnu::cold, gnu::noinline]] void tensor_problem(
    const core::Tensor& tensor, Kind kind, const char* role, const MpiCommunicator::State& state) {
  const char* op = collective_kind_name(kind);
  MPIGRAD_CHECK(tensor.defined(), op, " on communicator '", state.name, "': ", role, " is undefined");
  MPIGRAD_CHECK(tensor.device().is_cpu(), op, " on communicator '", state.name, "' (MPI backend): ",
                role, " is on ", tensor.device(), "; the MPI backend handles host tensors, use the "
                "nccl backend for CUDA tensors");
  core::fail(op, " on communicator '", state.name, "': ", role, " of shape ", tensor.shape(),
             " is not contiguous; call .contiguous() first");
}

inline void check_tensor(const core::Tensor& tensor, Kind kind, const char* role,
                         const MpiCommunicator::State& state) {
  if (!(tensor.defined() && tensor.device().is_cpu() && tensor.is_contiguous())) [[unlikely]] {
    tensor_problem(tensor, kind, role, state);
  }
}

[[noreturn, gnu::cold, gnu::noinline]] void dtype_mismatch(
    const core::Tensor& input, const core::Tensor& output, Kind kind,
    const MpiCommunicator::State& state) {
  core::fail(collective_kind_name(kind), " on communicator '", state.name, "': input is ",
             input.dtype(), " but output is ", output.dtype());
}

inline void check_pair(const core::Tensor& input, const core::Tensor& output, Kind kind,
                       const MpiCommunicator::State& state) {
  check_tensor(input, kind, "input", state);
  check_tensor(output, kind, "output", state);
  if (input.dtype() != output.dtype()) [[unlikely]] dtype_mismatch(input, output, kind, state);
}

// Avg = sum / size, applied to the output after the sum completes.
void divide_by(const core::Tensor& tensor, int divisor) {
  kernels::visit_floating(tensor.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using C = kernels::compute_t<T>;
    T* data = static_cast<T*>(tensor.data_ptr());
    C scale = C(1) / C(divisor);
    for (int64_t i = 0, n = tensor.numel(); i < n; ++i) data[i] = T(C(data[i]) * scale);
  });
}

void finish(const Call& call, int size) {
  if ((call.kind == Kind::AllReduce || call.kind == Kind::ReduceScatter) &&
      call.reduce == ReduceOp::Avg && size > 1) {
    divide_by(*call.output, size);
  }
}

// MPIGRAD_DEBUG_COLLECTIVES: every rank shares what it is about to call and all compare.
void check_agreement(const MpiCommunicator::State& state, const Call& call, uint64_t seq) {
  CollectiveSignature signature{call.kind, call.dtype, int64_t(call.count), int64_t(call.root),
                                call.reduce, hash_counts(call.counts)};
  std::string where = "[rank " + std::to_string(state.rank) + "/" + std::to_string(state.size) +
                      "] communicator '" + state.name + "'";
  check_collective_agreement(state.control, state.size, where, state.name, signature, seq);
}

// Numbers the collective, runs the debug check, and returns the sequence number.
uint64_t begin(const MpiCommunicator::State& state, const Call& call) {
  uint64_t seq = state.watchdog->next_sequence();
  if (state.config.debug_collectives) check_agreement(state, call, seq);
  return seq;
}

void run_blocking(MpiCommunicator::State& state, Call& call) {
  uint64_t seq = begin(state, call);
  CollectiveWatchdog::WaitScope scope(*state.watchdog, seq, collective_kind_name(call.kind), call.bytes);
  MPI_Comm comm = state.comm.comm;
  int rc = MPI_SUCCESS;
  const char* what = "";
  switch (call.kind) {
    case Kind::AllReduce:
      what = "MPI_Allreduce";
      rc = MPI_Allreduce(call.send(), call.recv(), call.count, call.type, call.mpi_op, comm);
      break;
    case Kind::Broadcast:
      what = "MPI_Bcast";
      rc = MPI_Bcast(call.recv(), call.count, call.type, call.root, comm);
      break;
    case Kind::AllGather:
      what = "MPI_Allgather";
      rc = MPI_Allgather(call.send(), call.count, call.type, call.recv(), call.count,
                         call.type, comm);
      break;
    case Kind::AllGatherV:
      what = "MPI_Allgatherv";
      rc = MPI_Allgatherv(call.send(), call.count, call.type, call.recv(),
                          call.counts.data(), call.displs.data(), call.type, comm);
      break;
    case Kind::ReduceScatter:
      what = "MPI_Reduce_scatter_block";
      rc = MPI_Reduce_scatter_block(call.input->data_ptr(), call.recv(), call.count,
                                    call.type, call.mpi_op, comm);
      break;
    case Kind::Barrier:
      what = "MPI_Barrier";
      rc = MPI_Barrier(comm);
      break;
  }
  if (rc != MPI_SUCCESS) [[unlikely]] {
    check_mpi(rc, what, "communicator '" + state.name + "', collective #" + std::to_string(seq));
  }
  finish(call, state.size);
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiCommunicator::State> state, Call call, uint64_t seq)
      : state_(std::move(state)), call_(std::move(call)), seq_(seq) {
    if (call_.input != nullptr) input_ = *call_.input;
    if (call_.output != nullptr) output_ = *call_.output;
    call_.input = &input_;
    call_.output = &output_;
  }

  ~MpiWork() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "%s\n", error.what());
    }
  }

  // Issues the nonblocking call. The Work owns the Call because MPI reads the buffers and the
  // all_gather_v count and displacement arrays until the operation completes.
  void start() {
    Call& c = call_;
    MPI_Comm comm = state_->comm.comm;
    int rc = MPI_SUCCESS;
    const char* what = "";
    switch (c.kind) {
      case Kind::AllReduce:
        what = "MPI_Iallreduce";
        rc = MPI_Iallreduce(c.send(), c.recv(), c.count, c.type, c.mpi_op, comm, &request_);
        break;
      case Kind::Broadcast:
        what = "MPI_Ibcast";
        rc = MPI_Ibcast(c.recv(), c.count, c.type, c.root, comm, &request_);
        break;
      case Kind::AllGather:
        what = "MPI_Iallgather";
        rc = MPI_Iallgather(c.send(), c.count, c.type, c.recv(), c.count, c.type, comm,
                            &request_);
        break;
      case Kind::AllGatherV:
        what = "MPI_Iallgatherv";
        rc = MPI_Iallgatherv(c.send(), c.count, c.type, c.recv(), c.counts.data(),
                             c.displs.data(), c.type, comm, &request_);
        break;
      case Kind::ReduceScatter:
        what = "MPI_Ireduce_scatter_block";
        rc = MPI_Ireduce_scatter_block(c.input->data_ptr(), c.recv(), c.count, c.type,
                                       c.mpi_op, comm, &request_);
        break;
      case Kind::Barrier:
        what = "MPI_Ibarrier";
        rc = MPI_Ibarrier(comm, &request_);
        break;
    }
    if (rc != MPI_SUCCESS) done_ = true;  // nothing in flight to wait for in the destructor
    check(rc, what);
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) complete();
    return done_;
  }

  void wait() override {
    if (done_) return;
    CollectiveWatchdog::WaitScope scope(*state_->watchdog, seq_, collective_kind_name(call_.kind), call_.bytes);
    check(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
    complete();
  }

 private:
  // The message is only built on failure: test() runs in tight polling loops.
  void check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) [[unlikely]] check_mpi(rc, what, context());
  }
  std::string context() const {
    return std::string(collective_kind_name(call_.kind)) + " #" + std::to_string(seq_) + " on communicator '" +
           state_->name + "'";
  }
  void complete() {
    done_ = true;
    finish(call_, state_->size);
    input_ = core::Tensor();  // release the buffers as soon as MPI is done with them
    output_ = core::Tensor();
  }

  std::shared_ptr<MpiCommunicator::State> state_;
  Call call_;
  core::Tensor input_, output_;
  uint64_t seq_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

WorkPtr start_async(const std::shared_ptr<MpiCommunicator::State>& state, Call call) {
  uint64_t seq = begin(*state, call);
  auto work = std::make_shared<MpiWork>(state, std::move(call), seq);
  work->start();
  return work;
}

}  // namespace

// ---- Argument checking: one Call per operation ---------------------------------------------------

namespace {

// Why a dtype has no reduction op in the table: the runtime's lookup raises the reason.
[[noreturn, gnu::cold, gnu::noinline]] void unsupported_reduction(
    const MpiCommunicator::State& state, Kind kind, core::DType dtype, ReduceOp op) {
  const char* name = collective_kind_name(kind);
  try {
    state.runtime->reduction_ops().find(dtype, op);
  } catch (const core::Error& error) {
    core::fail(name, " on communicator '", state.name, "': ", error.what());
  }
  core::fail(name, " on communicator '", state.name, "': no MPI reduction for ", dtype);
}

[[noreturn, gnu::cold, gnu::noinline]] void element_count_mismatch(
    const MpiCommunicator::State& state, int64_t input, int64_t output) {
  core::fail("all_reduce on communicator '", state.name, "': input has ", input,
             " elements but output has ", output);
}

Call reduce_call(const MpiCommunicator::State& state, Kind kind, const core::Tensor& input,
                 const core::Tensor& output, ReduceOp op) {
  check_pair(input, output, kind, state);
  Call call;
  call.kind = kind;
  call.input = &input;
  call.output = &output;
  call.dtype = input.dtype();
  call.type = state.types[size_t(call.dtype)];
  call.reduce = op;
  call.mpi_op = state.ops[size_t(call.dtype)][size_t(op)];
  if (call.mpi_op == MPI_OP_NULL) [[unlikely]] unsupported_reduction(state, kind, call.dtype, op);
  const int64_t in = input.numel(), out = output.numel();
  if (kind == Kind::AllReduce) {
    if (in != out) [[unlikely]] element_count_mismatch(state, in, out);
    call.count = to_int_count(in, "all_reduce", state.name);
    call.send_data = input.data_ptr();
    call.recv_data = output.data_ptr();
    call.in_place = call.send_data == call.recv_data;
    call.bytes = in * core::element_size(call.dtype);
  } else {
    const char* name = collective_kind_name(kind);
    MPIGRAD_CHECK(in == out * state.size, name, " on communicator '", state.name,
                  "': input must hold size (", state.size, ") x output (", out, ") = ",
                  out * state.size, " elements, got ", in);
    MPIGRAD_CHECK(in == 0 || input.data_ptr() != output.data_ptr(), name, " on communicator '",
                  state.name, "': input and output must not alias");
    call.count = to_int_count(out, name, state.name);
    call.bytes = input.nbytes();
  }
  return call;
}

Call broadcast_call(const MpiCommunicator::State& state, const core::Tensor& tensor, int root) {
  check_tensor(tensor, Kind::Broadcast, "tensor", state);
  MPIGRAD_CHECK(root >= 0 && root < state.size, "broadcast on communicator '", state.name,
                "': root ", root, " is not a rank of this communicator (size ", state.size, ")");
  Call call;
  call.kind = Kind::Broadcast;
  call.output = &tensor;
  call.dtype = tensor.dtype();
  call.type = state.types[size_t(call.dtype)];
  call.root = root;
  call.count = to_int_count(tensor.numel(), "broadcast", state.name);
  call.bytes = tensor.nbytes();
  return call;
}

Call all_gather_call(const MpiCommunicator::State& state, const core::Tensor& input,
                     const core::Tensor& output) {
  check_pair(input, output, Kind::AllGather, state);
  MPIGRAD_CHECK(output.numel() == input.numel() * state.size, "all_gather on communicator '",
                state.name, "': output must hold size (", state.size, ") x input (", input.numel(),
                ") = ", input.numel() * state.size, " elements, got ", output.numel());
  Call call;
  call.kind = Kind::AllGather;
  call.input = &input;
  call.output = &output;
  call.dtype = input.dtype();
  call.type = state.types[size_t(call.dtype)];
  call.count = to_int_count(input.numel(), "all_gather", state.name);
  // In place when this rank's input already is its block of the output.
  call.in_place = input.numel() > 0 &&
                  input.data_ptr() == static_cast<char*>(output.data_ptr()) +
                                          int64_t(state.rank) * input.nbytes();
  call.bytes = output.nbytes();
  return call;
}

Call all_gather_v_call(const MpiCommunicator::State& state, const core::Tensor& input,
                       const core::Tensor& output, std::span<const int64_t> counts) {
  check_pair(input, output, Kind::AllGatherV, state);
  MPIGRAD_CHECK(int64_t(counts.size()) == state.size, "all_gather_v on communicator '", state.name,
                "': counts has ", counts.size(), " entries, expected one per rank (", state.size, ")");
  Call call;
  call.kind = Kind::AllGatherV;
  call.input = &input;
  call.output = &output;
  call.dtype = input.dtype();
  call.type = state.types[size_t(call.dtype)];
  int64_t total = 0;
  for (int r = 0; r < state.size; ++r) {
    MPIGRAD_CHECK(counts[size_t(r)] >= 0, "all_gather_v on communicator '", state.name,
                  "': counts[", r, "] = ", counts[size_t(r)], " is negative");
    call.counts.push_back(to_int_count(counts[size_t(r)], "all_gather_v", state.name));
    call.displs.push_back(to_int_count(total, "all_gather_v", state.name));
    total += counts[size_t(r)];
  }
  MPIGRAD_CHECK(input.numel() == counts[size_t(state.rank)], "all_gather_v on communicator '",
                state.name, "': rank ", state.rank, " passes ", input.numel(),
                " elements but counts[", state.rank, "] = ", counts[size_t(state.rank)]);
  MPIGRAD_CHECK(output.numel() == total, "all_gather_v on communicator '", state.name,
                "': output has ", output.numel(), " elements, the counts sum to ", total);
  call.count = call.counts[size_t(state.rank)];
  call.in_place = input.numel() > 0 &&
                  input.data_ptr() == static_cast<char*>(output.data_ptr()) +
                                          int64_t(call.displs[size_t(state.rank)]) * input.element_size();
  call.bytes = output.nbytes();
  return call;
}

}  // namespace

// ---- MpiCommunicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MpiCommHandle&& comm, std::shared_ptr<MpiRuntime> runtime,
                                 std::string name, CollectiveConfig config)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.runtime = std::move(runtime);
  s.comm = std::move(comm);
  s.name = std::move(name);
  s.config = config;
  check_mpi(MPI_Comm_set_errhandler(s.comm.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", s.name);
  check_mpi(MPI_Comm_rank(s.comm.comm, &s.rank), "MPI_Comm_rank", s.name);
  check_mpi(MPI_Comm_size(s.comm.comm, &s.size), "MPI_Comm_size", s.name);
  for (int d = 0; d < kernels::kNumDTypes; ++d) {
    const auto dtype = core::DType(d);
    s.types[size_t(d)] = mpi_datatype(dtype);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      MPI_Op& slot = s.ops[size_t(d)][size_t(op)];
      try {
        slot = s.runtime->reduction_ops().find(dtype, op);
      } catch (const core::Error&) {
        slot = MPI_OP_NULL;  // reduce_call asks again, for the message
      }
    }
  }
  s.control = duplicate_communicator(s.comm.comm, "control communicator of '" + s.name + "'");
  s.watchdog = std::make_unique<CollectiveWatchdog>(
      s.control, s.name, config.timeout_seconds,
      s.runtime->thread_level() == ThreadLevel::Multiple);
}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }
const std::string& MpiCommunicator::name() const { return state_->name; }
const MpiCommHandle& MpiCommunicator::handle() const { return state_->comm; }
const std::shared_ptr<MpiRuntime>& MpiCommunicator::runtime() const { return state_->runtime; }
uint64_t MpiCommunicator::collectives_started() const { return state_->watchdog->started(); }

WorkPtr MpiCommunicator::all_reduce_async(const core::Tensor& input, const core::Tensor& output,
                                          ReduceOp op) {
  return start_async(state_, reduce_call(*state_, Kind::AllReduce, input, output, op));
}
// The one latency-bound collective (SyncBatchNorm's statistics, DDP's small buckets, metrics),
// written out: the checks, the sequence number, the watchdog's bracket and MPI_Allreduce, with
// no Call in between. Counted with callgrind on an 8-byte in-place all-reduce: mpigrad added
// 325 instructions a call to raw MPI_Allreduce through reduce_call and run_blocking, 211 this
// way checking the tensor as two, and 155 once. The debug agreement check takes the
// general path.
void MpiCommunicator::all_reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) {
  State& s = *state_;
  if (s.config.debug_collectives) [[unlikely]] {
    Call call = reduce_call(s, Kind::AllReduce, input, output, op);
    run_blocking(s, call);
    return;
  }
  // In place (the one-tensor form, which DDP and SyncBatchNorm use) checks the tensor once.
  const bool same = input.is_same(output);
  if (same) {
    check_tensor(input, Kind::AllReduce, "input", s);
  } else {
    check_pair(input, output, Kind::AllReduce, s);
  }
  const core::DType dtype = input.dtype();
  const MPI_Op mpi_op = s.ops[size_t(dtype)][size_t(op)];
  if (mpi_op == MPI_OP_NULL) [[unlikely]] unsupported_reduction(s, Kind::AllReduce, dtype, op);
  const int64_t count = input.numel();
  if (!same && count != output.numel()) [[unlikely]] {
    element_count_mismatch(s, count, output.numel());
  }
  // Every check before the sequence number: a refused call takes no collective's number.
  const int mpi_count = to_int_count(count, "all_reduce", s.name);
  void* recv = output.data_ptr();
  const void* send = same ? recv : input.data_ptr();
  const uint64_t seq = s.watchdog->next_sequence();
  int rc = MPI_SUCCESS;
  {
    CollectiveWatchdog::WaitScope scope(*s.watchdog, seq, "all_reduce",
                                        count * core::element_size(dtype));
    rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, mpi_count,
                       s.types[size_t(dtype)], mpi_op, s.comm.comm);
  }
  if (rc != MPI_SUCCESS) [[unlikely]] {
    check_mpi(rc, "MPI_Allreduce", "communicator '" + s.name + "', collective #" +
                                       std::to_string(seq));
  }
  if (op == ReduceOp::Avg && s.size > 1) divide_by(output, s.size);
}

WorkPtr MpiCommunicator::broadcast_async(const core::Tensor& tensor, int root) {
  return start_async(state_, broadcast_call(*state_, tensor, root));
}
void MpiCommunicator::broadcast(const core::Tensor& tensor, int root) {
  Call call = broadcast_call(*state_, tensor, root);
  run_blocking(*state_, call);
}

WorkPtr MpiCommunicator::all_gather_async(const core::Tensor& input, const core::Tensor& output) {
  return start_async(state_, all_gather_call(*state_, input, output));
}
void MpiCommunicator::all_gather(const core::Tensor& input, const core::Tensor& output) {
  Call call = all_gather_call(*state_, input, output);
  run_blocking(*state_, call);
}

WorkPtr MpiCommunicator::all_gather_v_async(const core::Tensor& input, const core::Tensor& output,
                                            std::span<const int64_t> counts) {
  return start_async(state_, all_gather_v_call(*state_, input, output, counts));
}
void MpiCommunicator::all_gather_v(const core::Tensor& input, const core::Tensor& output,
                                   std::span<const int64_t> counts) {
  Call call = all_gather_v_call(*state_, input, output, counts);
  run_blocking(*state_, call);
}

WorkPtr MpiCommunicator::reduce_scatter_async(const core::Tensor& input, const core::Tensor& output,
                                              ReduceOp op) {
  return start_async(state_, reduce_call(*state_, Kind::ReduceScatter, input, output, op));
}
void MpiCommunicator::reduce_scatter(const core::Tensor& input, const core::Tensor& output,
                                     ReduceOp op) {
  Call call = reduce_call(*state_, Kind::ReduceScatter, input, output, op);
  run_blocking(*state_, call);
}

WorkPtr MpiCommunicator::barrier_async() { return start_async(state_, Call{}); }
void MpiCommunicator::barrier() {
  Call call;
  run_blocking(*state_, call);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(state_->comm.comm, color < 0 ? MPI_UNDEFINED : color, key, &part),
            "MPI_Comm_split", "communicator '" + state_->name + "' into '" + name + "'");
  if (part == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(MpiCommHandle(part), state_->runtime, std::move(name),
                                           state_->config);
}

std::unique_ptr<Communicator> MpiCommunicator::split_node_local(std::string name) {
  MPI_Comm part = MPI_COMM_NULL;
  if (const int nodes = simulated_node_count(); nodes > 0) {
    // Every rank sees the same size and the same variable, so every rank raises this or none.
    MPIGRAD_CHECK(state_->size % nodes == 0, "MPIGRAD_SIMULATE_NODES=", nodes,
                  ": the ", state_->size, " ranks of communicator '", state_->name,
                  "' do not split into ", nodes, " equal nodes; launch a multiple of ", nodes,
                  " ranks or change the variable");
    const int per_node = state_->size / nodes;
    check_mpi(MPI_Comm_split(state_->comm.comm, state_->rank / per_node, state_->rank, &part),
              "MPI_Comm_split", "simulated node of communicator '" + state_->name + "'");
    return std::make_unique<MpiCommunicator>(MpiCommHandle(part), state_->runtime,
                                             std::move(name), state_->config);
  }
  check_mpi(MPI_Comm_split_type(state_->comm.comm, MPI_COMM_TYPE_SHARED, state_->rank,
                                MPI_INFO_NULL, &part),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", "communicator '" + state_->name + "'");
  return std::make_unique<MpiCommunicator>(MpiCommHandle(part), state_->runtime, std::move(name),
                                           state_->config);
}

// ---- Interop ------------------------------------------------------------------------------------

MpiCommHandle duplicate_communicator(MPI_Comm comm, std::string_view what) {
  MPIGRAD_CHECK(comm != MPI_COMM_NULL, "mpigrad: cannot duplicate MPI_COMM_NULL (", what, ")");
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup", what);
  MpiCommHandle handle(copy);
  check_mpi(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", what);
  return handle;
}

}  // namespace mpigrad::launch
