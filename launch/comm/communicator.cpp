// Names and parsing for the communicator enums, the environment-driven collective config, world
// ranks, and the argument checks every backend's collectives go through.
#include "mpigrad/launch/comm/communicator.h"

#include <cstdlib>
#include <numeric>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
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

// ---- Argument checks ------------------------------------------------------------------------
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

}  // namespace

// Inline: the in-place all-reduce is the latency-bound collective (see MpiCommunicator).
inline void Communicator::check_reduce(bool scatter, const core::Tensor& input,
                                       const core::Tensor& output, ReduceOp op) const {
  // In place (the one-tensor form, which DDP and SyncBatchNorm use): one tensor to check and no
  // counts to compare.
  if (!scatter && input.is_same(output)) {
    check_tensor(*this, device(), input, "all_reduce", "input");
    if (op == ReduceOp::Avg && !core::is_floating(input.dtype())) [[unlikely]] {
      reduce_problem(*this, scatter, input, output, op);
    }
    return;
  }
  check_pair(*this, input, output, scatter ? "reduce_scatter" : "all_reduce");
  const bool avg_ok = op != ReduceOp::Avg || core::is_floating(input.dtype());
  const int64_t in = input.numel(), out = output.numel();
  const bool counts_ok =
      scatter ? in == out * size() && (in == 0 || input.data_ptr() != output.data_ptr())
              : in == out;
  if (!(avg_ok && counts_ok)) [[unlikely]]
    reduce_problem(*this, scatter, input, output, op);
}

void Communicator::check_broadcast(const core::Tensor& tensor, int root) const {
  check_tensor(*this, device(), tensor, "broadcast", "tensor");
  MPIGRAD_CHECK(root >= 0 && root < size(), where(*this, "broadcast"), "root ", root,
                " is not a rank of this communicator (size ", size(), ")");
}

void Communicator::check_all_gather(const core::Tensor& input, const core::Tensor& output) const {
  check_pair(*this, input, output, "all_gather");
  const int64_t size = this->size();
  MPIGRAD_CHECK(output.numel() == input.numel() * size, where(*this, "all_gather"),
                "output must hold size (", size, ") x input (", input.numel(),
                ") = ", input.numel() * size, " elements, got ", output.numel());
}

void Communicator::check_all_gather_v(const core::Tensor& input, const core::Tensor& output,
                                      std::span<const int64_t> counts) const {
  check_pair(*this, input, output, "all_gather_v");
  const int size = this->size(), rank = this->rank();
  MPIGRAD_CHECK(int64_t(counts.size()) == size, where(*this, "all_gather_v"), "counts has ",
                counts.size(), " entries, expected one per rank (", size, ")");
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    MPIGRAD_CHECK(counts[size_t(r)] >= 0, where(*this, "all_gather_v"), "counts[", r,
                  "] = ", counts[size_t(r)], " is negative");
    total += counts[size_t(r)];
  }
  MPIGRAD_CHECK(input.numel() == counts[size_t(rank)], where(*this, "all_gather_v"), "this rank (",
                rank, " of the communicator) passes ", input.numel(), " elements but counts[", rank,
                "] = ", counts[size_t(rank)]);
  MPIGRAD_CHECK(output.numel() == total, where(*this, "all_gather_v"), "output has ",
                output.numel(), " elements, the counts sum to ", total);
}

// ---- The public calls: check, then the backend's implementation ------------------------------

WorkPtr Communicator::all_reduce_async(const core::Tensor& input, const core::Tensor& output,
                                       ReduceOp op) {
  check_reduce(false, input, output, op);
  return all_reduce_async_impl(input, output, op);
}
void Communicator::all_reduce(const core::Tensor& input, const core::Tensor& output, ReduceOp op) {
  check_reduce(false, input, output, op);
  all_reduce_impl(input, output, op);
}

WorkPtr Communicator::broadcast_async(const core::Tensor& tensor, int root) {
  check_broadcast(tensor, root);
  return broadcast_async_impl(tensor, root);
}
void Communicator::broadcast(const core::Tensor& tensor, int root) {
  check_broadcast(tensor, root);
  broadcast_impl(tensor, root);
}

WorkPtr Communicator::all_gather_async(const core::Tensor& input, const core::Tensor& output) {
  check_all_gather(input, output);
  return all_gather_async_impl(input, output);
}
void Communicator::all_gather(const core::Tensor& input, const core::Tensor& output) {
  check_all_gather(input, output);
  all_gather_impl(input, output);
}

WorkPtr Communicator::all_gather_v_async(const core::Tensor& input, const core::Tensor& output,
                                         std::span<const int64_t> counts) {
  check_all_gather_v(input, output, counts);
  return all_gather_v_async_impl(input, output, counts);
}
void Communicator::all_gather_v(const core::Tensor& input, const core::Tensor& output,
                                std::span<const int64_t> counts) {
  check_all_gather_v(input, output, counts);
  all_gather_v_impl(input, output, counts);
}

WorkPtr Communicator::reduce_scatter_async(const core::Tensor& input, const core::Tensor& output,
                                           ReduceOp op) {
  check_reduce(true, input, output, op);
  return reduce_scatter_async_impl(input, output, op);
}
void Communicator::reduce_scatter(const core::Tensor& input, const core::Tensor& output,
                                  ReduceOp op) {
  check_reduce(true, input, output, op);
  reduce_scatter_impl(input, output, op);
}

}  // namespace mpigrad::launch
