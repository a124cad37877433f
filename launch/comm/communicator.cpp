// Names and parsing for the communicator enums, the environment-driven collective config, world
// ranks, and the public calls: the argument checks every backend's collectives go through and
// the one description of each call (collective.h) that every backend runs.
#include "mpigrad/launch/comm/communicator.h"

#include <cstdlib>
#include <numeric>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

std::string_view reduce_op_name(ReduceOp op) {
  return core::enum_name(op, kReduceOpNames);
}

Backend parse_backend(std::string_view text) {
  return core::parse_enum<Backend>(text, kBackendNames, "communication backend");
}

std::string_view backend_name(Backend backend) {
  return core::enum_name(backend, kBackendNames);
}

CollectiveConfig CollectiveConfig::from_environment() {
  CollectiveConfig config;
  if (const char* text = std::getenv("MPIGRAD_COLLECTIVE_TIMEOUT"); text != nullptr && *text) {
    char* end = nullptr;
    double seconds = std::strtod(text, &end);
    MPIGRAD_CHECK(end != text && *end == '\0', "MPIGRAD_COLLECTIVE_TIMEOUT='", text,
                  "' is not a number of seconds");
    config.timeout_seconds = seconds;
  }
  if (const char* text = std::getenv("MPIGRAD_DEBUG_COLLECTIVES"); text != nullptr) {
    std::string_view value(text);
    config.debug_collectives =
        !(value.empty() || value == "0" || value == "false" || value == "off");
  }
  return config;
}

int simulated_node_count() {
  const char* text = std::getenv("MPIGRAD_SIMULATE_NODES");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long nodes = std::strtol(text, &end, 10);
  MPIGRAD_CHECK(end != text && *end == '\0' && nodes >= 1 && nodes <= 1 << 20,
                "MPIGRAD_SIMULATE_NODES='", text, "' is not a positive number of nodes");
  return int(nodes);
}

WorldRanks WorldRanks::identity(int size) {
  WorldRanks world;
  world.size = size;
  world.of_member.resize(size_t(size));
  std::iota(world.of_member.begin(), world.of_member.end(), 0);
  return world;
}

std::string WorldRanks::host(int world_rank) const {
  if (!hosts || world_rank < 0 || size_t(world_rank) >= hosts->size()) return "";
  return (*hosts)[size_t(world_rank)];
}

std::string Communicator::world_label() const {
  return rank_label(world_rank(), world_size());
}

// ---- Argument checks and descriptions --------------------------------------------------------
// They run on every call, so the fast path is a few inline comparisons and the messages are
// built only on failure, in code kept off it (measured with perf on an 8-byte MPI all-reduce:
// inline checks with their message set-up were a third of mpigrad's 130 ns over raw
// MPI_Allreduce).

namespace {

// "[rank 3/4] all_reduce on communicator 'world inter-node': "
std::string where(const Communicator& communicator, const char* op) {
  return communicator.world_label() + " " + op + " on communicator '" + communicator.name() + "': ";
}

[[noreturn, gnu::cold, gnu::noinline]] void tensor_problem(const Communicator& communicator,
                                                           const core::Tensor& tensor,
                                                           const char* op, const char* role) {
  const std::string at = where(communicator, op);
  MPIGRAD_CHECK(tensor.defined(), at, role, " is undefined");
  const core::Device device = communicator.device();
  MPIGRAD_CHECK(tensor.device() == device, at, role, " is on ", tensor.device(), ", but the ",
                backend_name(communicator.backend()), " backend here moves ", device, " tensors; ",
                device.is_cpu() ? "use the nccl backend for CUDA tensors"
                                : "use the mpi backend for host tensors");
  core::fail(at, role, " of shape ", tensor.shape(),
             " is not contiguous; call .contiguous() first");
}

inline void check_tensor(const Communicator& communicator, core::Device device,
                         const core::Tensor& tensor, const char* op, const char* role) {
  if (!(tensor.defined() && tensor.device() == device && tensor.is_contiguous())) [[unlikely]] {
    tensor_problem(communicator, tensor, op, role);
  }
}

inline void check_pair(const Communicator& communicator, const core::Tensor& input,
                       const core::Tensor& output, const char* op) {
  const core::Device device = communicator.device();
  check_tensor(communicator, device, input, op, "input");
  check_tensor(communicator, device, output, op, "output");
  if (input.dtype() != output.dtype()) [[unlikely]] {
    core::fail(where(communicator, op), "input is ", input.dtype(), " but output is ",
               output.dtype());
  }
}

[[noreturn, gnu::cold, gnu::noinline]] void reduce_problem(const Communicator& communicator,
                                                           bool scatter, const core::Tensor& input,
                                                           const core::Tensor& output,
                                                           ReduceOp op) {
  const char* name = scatter ? "reduce_scatter" : "all_reduce";
  const std::string at = where(communicator, name);
  MPIGRAD_CHECK(op != ReduceOp::Avg || core::is_floating(input.dtype()), at,
                "reduce op avg needs a floating dtype, got ", input.dtype(),
                "; use sum and divide");
  const int64_t in = input.numel(), out = output.numel(), size = communicator.size();
  MPIGRAD_CHECK(scatter || in == out, at, "input has ", in, " elements but output has ", out);
  MPIGRAD_CHECK(!scatter || in == out * size, at, "input must hold size (", size, ") x output (",
                out, ") = ", out * size, " elements, got ", in);
  core::fail(at, "input and output must not alias");
}

void check_root(const Communicator& communicator, int root, const char* op) {
  MPIGRAD_CHECK(root >= 0 && root < communicator.size(), where(communicator, op), "root ", root,
                " is not a rank of this communicator (size ", communicator.size(), ")");
}

// The v forms' counts: one per rank, none negative, this rank's the size of its input. Returns
// their sum, the output's size.
int64_t check_counts(const Communicator& communicator, std::span<const int64_t> counts,
                     const core::Tensor& input, const char* op) {
  const int size = communicator.size(), rank = communicator.rank();
  MPIGRAD_CHECK(int64_t(counts.size()) == size, where(communicator, op), "counts has ",
                counts.size(), " entries, expected one per rank (", size, ")");
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    MPIGRAD_CHECK(counts[size_t(r)] >= 0, where(communicator, op), "counts[", r,
                  "] = ", counts[size_t(r)], " is negative");
    total += counts[size_t(r)];
  }
  MPIGRAD_CHECK(input.numel() == counts[size_t(rank)], where(communicator, op), "this rank (", rank,
                " of the communicator) passes ", input.numel(), " elements but counts[", rank,
                "] = ", counts[size_t(rank)]);
  return total;
}

// Whether this rank's input already lies at its block of the output (elements from `offset`).
bool input_is_block(const core::Tensor& input, const core::Tensor& output, int64_t offset) {
  return input.numel() > 0 &&
         input.data_ptr() == static_cast<char*>(output.data_ptr()) + offset * input.element_size();
}

}  // namespace

// Inline: the in-place all-reduce is the latency-bound collective (see MpiCommunicator).
inline Collective Communicator::describe_reduce(CollectiveKind kind, const core::Tensor& input,
                                                const core::Tensor& output, ReduceOp op) const {
  const bool scatter = kind == CollectiveKind::ReduceScatter;
  Collective collective;
  collective.kind = kind;
  collective.input = &input;
  collective.output = &output;
  collective.op = op;
  // In place (the one-tensor form, which DDP and SyncBatchNorm use): one tensor to check and no
  // counts to compare.
  if (!scatter && input.is_same(output)) {
    check_tensor(*this, device(), input, "all_reduce", "input");
    if (op == ReduceOp::Avg && !core::is_floating(input.dtype())) [[unlikely]] {
      reduce_problem(*this, scatter, input, output, op);
    }
    collective.dtype = input.dtype();
    collective.count = input.numel();
    collective.in_place = true;
    collective.bytes = input.nbytes();
    return collective;
  }
  check_pair(*this, input, output, scatter ? "reduce_scatter" : "all_reduce");
  const bool avg_ok = op != ReduceOp::Avg || core::is_floating(input.dtype());
  const int64_t in = input.numel(), out = output.numel();
  const bool counts_ok =
      scatter ? in == out * size() && (in == 0 || input.data_ptr() != output.data_ptr())
              : in == out;
  if (!(avg_ok && counts_ok)) [[unlikely]]
    reduce_problem(*this, scatter, input, output, op);
  collective.dtype = input.dtype();
  collective.count = out;  // all_reduce: the tensor; reduce_scatter: this rank's block
  collective.in_place = !scatter && input.data_ptr() == output.data_ptr();
  collective.bytes = input.nbytes();
  return collective;
}

Collective Communicator::describe_broadcast(const core::Tensor& tensor, int root) const {
  check_tensor(*this, device(), tensor, "broadcast", "tensor");
  check_root(*this, root, "broadcast");
  Collective collective;
  collective.kind = CollectiveKind::Broadcast;
  collective.output = &tensor;
  collective.dtype = tensor.dtype();
  collective.root = root;
  collective.count = tensor.numel();
  collective.bytes = tensor.nbytes();
  return collective;
}

Collective Communicator::describe_all_gather(const core::Tensor& input, const core::Tensor& output,
                                             std::span<const int64_t> counts, bool v) const {
  const char* op = v ? "all_gather_v" : "all_gather";
  check_pair(*this, input, output, op);
  Collective collective;
  collective.kind = v ? CollectiveKind::AllGatherV : CollectiveKind::AllGather;
  collective.input = &input;
  collective.output = &output;
  collective.dtype = input.dtype();
  collective.count = input.numel();
  if (v) {
    const int64_t total = check_counts(*this, counts, input, op);
    MPIGRAD_CHECK(output.numel() == total, where(*this, op), "output has ", output.numel(),
                  " elements, the counts sum to ", total);
    collective.counts = counts;
  } else {
    const int64_t size = this->size();
    MPIGRAD_CHECK(output.numel() == input.numel() * size, where(*this, op),
                  "output must hold size (", size, ") x input (", input.numel(),
                  ") = ", input.numel() * size, " elements, got ", output.numel());
  }
  collective.in_place = input_is_block(input, output, collective.offset_of(rank()));
  collective.bytes = output.nbytes();
  return collective;
}

Collective Communicator::describe_gather(const core::Tensor& input, const core::Tensor& output,
                                         std::span<const int64_t> counts, bool v, int root) const {
  const char* op = v ? "gather_v" : "gather";
  check_root(*this, root, op);
  const bool receives = rank() == root;
  if (receives) {
    check_pair(*this, input, output, op);
  } else {
    check_tensor(*this, device(), input, op, "input");
  }
  Collective collective;
  collective.kind = v ? CollectiveKind::GatherV : CollectiveKind::Gather;
  collective.input = &input;
  collective.dtype = input.dtype();
  collective.root = root;
  collective.count = input.numel();
  const int64_t total = v ? check_counts(*this, counts, input, op) : input.numel() * size();
  if (v) collective.counts = counts;
  if (receives) {
    MPIGRAD_CHECK(output.numel() == total, where(*this, op), "the root's output has ",
                  output.numel(), " elements, ", v ? "the counts sum to " : "size x input is ",
                  total);
    collective.output = &output;
    collective.in_place = input_is_block(input, output, collective.offset_of(root));
  }
  collective.bytes = receives ? output.nbytes() : input.nbytes();
  return collective;
}

// ---- The public calls: check and describe, then the backend runs the description -------------

WorkPtr Communicator::all_reduce_async(const core::Tensor& input, const core::Tensor& output,
                                       ReduceOp op) {
  return start_collective(describe_reduce(CollectiveKind::AllReduce, input, output, op));
}
void Communicator::all_reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) {
  run_collective(describe_reduce(CollectiveKind::AllReduce, input, output, op));
}

WorkPtr Communicator::broadcast_async(const core::Tensor& tensor, int root) {
  return start_collective(describe_broadcast(tensor, root));
}
void Communicator::broadcast(const core::Tensor& tensor, int root) {
  run_collective(describe_broadcast(tensor, root));
}

WorkPtr Communicator::all_gather_async(const core::Tensor& input, const core::Tensor& output) {
  return start_collective(describe_all_gather(input, output, {}, false));
}
void Communicator::all_gather(const core::Tensor& input, const core::Tensor& output) {
  run_collective(describe_all_gather(input, output, {}, false));
}

WorkPtr Communicator::all_gather_v_async(const core::Tensor& input, const core::Tensor& output,
                                         std::span<const int64_t> counts) {
  return start_collective(describe_all_gather(input, output, counts, true));
}
void Communicator::all_gather_v(const core::Tensor& input, const core::Tensor& output,
                                std::span<const int64_t> counts) {
  run_collective(describe_all_gather(input, output, counts, true));
}

WorkPtr Communicator::reduce_scatter_async(const core::Tensor& input, const core::Tensor& output,
                                           ReduceOp op) {
  return start_collective(describe_reduce(CollectiveKind::ReduceScatter, input, output, op));
}
void Communicator::reduce_scatter(const core::Tensor& input, const core::Tensor& output,
                                  ReduceOp op) {
  run_collective(describe_reduce(CollectiveKind::ReduceScatter, input, output, op));
}

WorkPtr Communicator::gather_async(const core::Tensor& input, const core::Tensor& output,
                                   int root) {
  return start_collective(describe_gather(input, output, {}, false, root));
}
void Communicator::gather(const core::Tensor& input, const core::Tensor& output, int root) {
  run_collective(describe_gather(input, output, {}, false, root));
}

WorkPtr Communicator::gather_v_async(const core::Tensor& input, const core::Tensor& output,
                                     std::span<const int64_t> counts, int root) {
  return start_collective(describe_gather(input, output, counts, true, root));
}
void Communicator::gather_v(const core::Tensor& input, const core::Tensor& output,
                            std::span<const int64_t> counts, int root) {
  run_collective(describe_gather(input, output, counts, true, root));
}

WorkPtr Communicator::barrier_async() {
  return start_collective(Collective{});
}
void Communicator::barrier() {
  run_collective(Collective{});
}

// ---- Forwarding a description ----------------------------------------------------------------

Collective Communicator::describe_again(const Collective& collective) const {
  static const core::Tensor kNone;  // where the description has no tensor
  const core::Tensor& input = collective.input != nullptr ? *collective.input : kNone;
  const core::Tensor& output = collective.output != nullptr ? *collective.output : kNone;
  switch (collective.kind) {
    case CollectiveKind::AllReduce:
    case CollectiveKind::ReduceScatter:
      return describe_reduce(collective.kind, input, output, collective.op);
    case CollectiveKind::Broadcast:
      return describe_broadcast(output, collective.root);
    case CollectiveKind::AllGather:
    case CollectiveKind::AllGatherV:
      return describe_all_gather(input, output, collective.counts, collective.is_v());
    case CollectiveKind::Gather:
    case CollectiveKind::GatherV:
      return describe_gather(input, output, collective.counts, collective.is_v(), collective.root);
    case CollectiveKind::Barrier:
      break;
  }
  return Collective{};
}

void Communicator::run(const Collective& collective) {
  run_collective(describe_again(collective));
}
WorkPtr Communicator::start(const Collective& collective) {
  return start_collective(describe_again(collective));
}

}  // namespace mpigrad::launch
