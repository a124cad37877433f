// HierarchicalAllReduce: set-up (thread level, node and inter-node communicators, padded shared
// buffers), the communication thread, and the failure protocol. See the header.
#include "mpigrad/launch/ddp/transports/hierarchical_all_reduce.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/kernels/elementwise.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/ddp/transports/shard_arithmetic.h"

namespace mpigrad::launch {

namespace {

int64_t round_up(int64_t value, int64_t to) {
  return (value + to - 1) / to * to;
}

// The piece of a shard that goes through the three steps at once (see process()): small enough
// to stay in L2 from the node's sum through MPI's reduction to the node's copies. Measured with
// mpigrad-bench-allreduce --hierarchical 36M on np 4 as 2 x 2 (loaded VM): 256 KiB 23-43 ms,
// 1 MiB 20-57 ms, 4 MiB 42-46 ms, the whole 18 MiB shard at once 37-68 ms.
constexpr int64_t kPieceBytes = int64_t(1) << 20;

// The communication thread's nice value for each way of waiting (see the header).
constexpr int kBlockingNice = 19;
constexpr int kSleepingNice = -20;

// Gives thread `tid` the nice value for `wait`: kBlockingNice, or kSleepingNice or as near as
// RLIMIT_NICE allows (root and CAP_SYS_NICE may take any value). Returns the nice value it has
// then. Not getting it is no error: the thread keeps the process's priority, and the
// transport's description says so.
int set_thread_priority(id_t tid, LinkWait wait) {
  if (wait == LinkWait::Blocking) {
    (void)setpriority(PRIO_PROCESS, tid, kBlockingNice);
  } else if (setpriority(PRIO_PROCESS, tid, kSleepingNice) != 0) {
    // RLIMIT_NICE n lets an unprivileged process go down to nice 20 - n.
    rlimit limit{};
    if (getrlimit(RLIMIT_NICE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        limit.rlim_cur > 0) {
      const int floor = 20 - int(std::min<rlim_t>(limit.rlim_cur, 40));
      (void)setpriority(PRIO_PROCESS, tid, std::max(kSleepingNice, floor));
    }
  }
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, tid);
  return errno == 0 ? nice : 0;
}

int64_t piece_elements(core::DType dtype) {
  return kPieceBytes / core::element_size(dtype);
}

// Elements a buffer of `numel` is padded to: L shards of whole cache lines, all of one length,
// each cut into N equal pieces (ZeRO-1's shards); `ranks` = N L.
int64_t padded_numel(int64_t numel, core::DType dtype, int ranks) {
  const int64_t per_line = int64_t(SharedSegments::kLine) / core::element_size(dtype);
  return round_up(numel, per_line * ranks);
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) out << (i ? ", " : "") << ranks[i];
  if (ranks.size() > 8) out << ", ... (" << ranks.size() << " ranks)";
  return out.str();
}

std::vector<int> gather_ranks(Communicator& group, int mine) {
  core::Tensor value = core::Tensor::from_vector<int32_t>({mine}, {1});
  core::Tensor all = core::zeros({group.size()}, core::kInt32);
  group.all_gather(value, all);
  std::vector<int32_t> ranks = all.to_vector<int32_t>();
  return {ranks.begin(), ranks.end()};
}

// target = source, element by element, rounded to target's dtype (both floating, same numel).
// On this thread alone, into a reused buffer, not Tensor::copy_ (which allocates a converted
// tensor per call and splits the work over OpenMP threads): with copy_ here the bf16 step of
// mpigrad-bench-ddp on 2 x 1 simulated-cluster nodes at 2 Gbit/s took 760 ms (about 15 ms more
// per 1 MiB piece), with a plain loop 134 ms; alone, both convert 36 pieces both ways in 7 ms.
// Why copy_ stalls on this thread was not pinned down. float32 to and from the wire's 16 bits is
// the kernels' vectorized single-thread conversion.
void convert_elements(const core::Tensor& source, const core::Tensor& target) {
  if (source.dtype() == core::kFloat32 || target.dtype() == core::kFloat32) {
    kernels::cpu::convert_dense(target.dtype(), source.dtype(), source.numel(), target.data_ptr(),
                                source.data_ptr());
    return;
  }
  kernels::visit_floating(source.dtype(), [&](auto from) {
    kernels::visit_floating(target.dtype(), [&](auto to) {
      using From = decltype(from);
      using To = decltype(to);
      const From* in = static_cast<const From*>(source.data_ptr());
      To* out = static_cast<To*>(target.data_ptr());
      for (int64_t i = 0, n = source.numel(); i < n; ++i) out[i] = To(float(in[i]));
    });
  });
}

int all_reduce_min(Communicator& communicator, int value) {
  core::Tensor flag = core::Tensor::from_vector<int32_t>({value}, {1});
  communicator.all_reduce(flag, ReduceOp::Min);
  return flag.item<int32_t>();
}

}  // namespace

struct HierarchicalAllReduce::Impl {
  // ---- Fixed at creation -------------------------------------------------------------------
  std::string communicator_name;
  int rank = 0, size = 1;  // in the caller's communicator
  int world_rank = 0;      // in mpigrad's world: how messages name ranks
  std::string label;       // "[rank r/w]", this rank's world label
  int local_rank = 0, local_size = 1, nodes = 1;
  double timeout_seconds = 0;
  std::unique_ptr<Communicator> cross;       // the inter-node step; the thread's alone
  std::unique_ptr<SharedSegments> segments;  // the node's copies, when local_size > 1
  std::vector<core::Tensor> own_buffers;     // when local_size == 1
  std::vector<SharedBufferSpec> specs;       // padded
  std::vector<int> local_rank_of;            // per rank of the caller's communicator
  std::vector<int> node_of;                  // per rank: its rank in its inter-node group
  std::optional<core::DType> wire;           // the inter-node step's dtype, when compressing
  LinkWait link_wait = LinkWait::Blocking;

  // ---- Main thread only --------------------------------------------------------------------
  std::vector<bool> in_flight;
  std::vector<uint64_t> rounds;  // when local_size == 1 (SharedSegments counts them otherwise)

  // ---- Shared between the main and the communication thread, under `mutex` ----------------
  std::mutex mutex;
  std::condition_variable wake_thread, wake_main;
  // Started buckets the thread has not taken yet, with what to do with them.
  std::deque<std::pair<size_t, BucketCollective>> queue;
  std::vector<uint64_t> done_round;  // per bucket: the last round whose own part is done
  std::string failure;               // the first failure; every later call repeats it
  int32_t failed_rank_code = 0;      // 1 + the world rank that failed first, as this rank knows it
  bool poison_pending = false;       // the main thread failed: the thread owes the status words
  bool stop = false;
  std::atomic<bool> failed{false};  // failure is set: a cheap check for the polling loops

  // ---- Communication thread only -----------------------------------------------------------
  size_t next_in_pass = 0;  // the bucket whose status word the thread exchanges next
  core::Tensor wire_piece;  // one piece in the wire dtype, reused (compression only)
  std::thread thread;
  std::promise<int> thread_nice;  // what set_thread_priority gave the thread
  int nice = 0;                   // the same, once the thread has started

  std::string where() const {
    std::ostringstream out;
    out << "hierarchical all-reduce on communicator '" << communicator_name << "' " << label;
    return out.str();
  }

  uint64_t round_of(size_t index) const {
    return segments ? segments->round(index) : rounds[index];
  }

  // Records the first failure (later ones are consequences), tells the node, wakes everyone.
  // Call with `mutex` held.
  void record_failure_locked(const std::string& message, int32_t code) {
    if (failure.empty()) {
      failure = where() + ": " + message;
      failed_rank_code = code;
      failed.store(true, std::memory_order_release);
      if (segments) segments->mark_gave_up();
    }
    wake_main.notify_all();
    wake_thread.notify_all();
  }

  void check_usable() {
    if (!failed.load(std::memory_order_acquire)) return;  // the common case takes no lock
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) {
      throw core::Error(where() + " is unusable after an earlier failure: " + failure);
    }
  }

  // A failure seen by the main thread: the thread still owes the other nodes this pass's status
  // words, so they learn of it instead of waiting in MPI.
  template <typename... Parts>
  [[noreturn]] void fail_from_main(const Parts&... parts) {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex);
      record_failure_locked(core::detail::concat(parts...), 1 + world_rank);
      poison_pending = true;
      message = failure;
      wake_thread.notify_all();
    }
    throw core::Error(message);
  }

  // ---- The communication thread --------------------------------------------------------------

  void run() {
    pthread_setname_np(pthread_self(), "mpigrad-comm");
    thread_nice.set_value(set_thread_priority(id_t(syscall(SYS_gettid)), link_wait));
    while (true) {
      size_t index = 0;
      BucketCollective collective = BucketCollective::Average;
      int32_t poison_code = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake_thread.wait(lock, [&] { return stop || poison_pending || !queue.empty(); });
        if (poison_pending) {
          poison_pending = false;
          poison_code = failed_rank_code;
          queue.clear();
        } else if (queue.empty()) {
          return;  // stop, and nothing left
        } else {
          std::tie(index, collective) = queue.front();
          queue.pop_front();
          if (!failure.empty()) continue;  // failed: the work is dropped
        }
      }
      try {
        if (poison_code != 0) {
          poison_rest_of_pass(poison_code);
        } else {
          process(index, collective);
        }
      } catch (const std::exception& error) {
        // An MPI error (the communicator reports it): the collectives may be out of step, so
        // nothing more goes over the network; the watchdog or MPI's own handler ends the job.
        std::lock_guard<std::mutex> lock(mutex);
        record_failure_locked(error.what(), 1 + world_rank);
      }
    }
  }

  // The inter-node collectives (sums), waited for as `link_wait` says (see the header): MPI's
  // blocking ones are its fast algorithms, the sleeping wait leaves the core to backward.
  void all_reduce_across(const core::Tensor& values, ReduceOp op) {
    if (link_wait == LinkWait::Sleeping) {
      cross->all_reduce_async(values, op)->wait_sleeping();
    } else {
      cross->all_reduce(values, op);
    }
  }
  void reduce_scatter_across(const core::Tensor& input, const core::Tensor& output) {
    if (link_wait == LinkWait::Sleeping) {
      cross->reduce_scatter_async(input, output, ReduceOp::Sum)->wait_sleeping();
    } else {
      cross->reduce_scatter(input, output, ReduceOp::Sum);
    }
  }
  void all_gather_across(const core::Tensor& input, const core::Tensor& output) {
    if (link_wait == LinkWait::Sleeping) {
      cross->all_gather_async(input, output)->wait_sleeping();
    } else {
      cross->all_gather(input, output);
    }
  }

  // The status when the nodes exchanged different rounds of one bucket.
  static constexpr int32_t kRoundsDiffer = std::numeric_limits<int32_t>::max();

  // Exchanges one status word with the other nodes for the current bucket: 0 when every rank is
  // fine, otherwise 1 + a rank that failed (the highest, so all agree), or kRoundsDiffer when
  // the nodes are at different rounds of the bucket (a rank whose backward failed halfway and
  // went on), which must not be averaged together. The round travels as (r, -r) under Max, so
  // one all-reduce gives both its largest and its smallest value.
  int32_t exchange_status(int32_t code, uint64_t round) {
    ++next_in_pass;
    if (nodes == 1) return code;
    const int64_t r = int64_t(round);
    core::Tensor status = core::Tensor::from_vector<int64_t>({code, r, -r}, {3});
    all_reduce_across(status, ReduceOp::Max);
    const std::vector<int64_t> all = status.to_vector<int64_t>();
    if (all[0] != 0) return int32_t(all[0]);
    return all[1] == -all[2] ? 0 : kRoundsDiffer;
  }

  // After a failure: the status words for the buckets of this pass not yet exchanged, so every
  // rank that shares an inter-node step with this one learns of the failure at that step.
  void poison_rest_of_pass(int32_t code) {
    while (next_in_pass < specs.size()) exchange_status(code, 0);
  }

  // Waits for every rank of the node to start `index`; "" when they have, else why not.
  std::string await_node_started(size_t index) {
    std::string out_of_step;
    int gave_up = -1;
    bool started = SharedSegments::poll_until(
        [&] {
          return segments->all_started(index, &out_of_step) || !out_of_step.empty() ||
                 gave_up >= 0 || failed.load(std::memory_order_acquire);
        },
        timeout_seconds, [&] { gave_up = segments->first_peer_gave_up(); });
    if (!out_of_step.empty()) return out_of_step;
    if (failed.load(std::memory_order_acquire)) return "this rank failed";
    // A rank that gave up may be refilling its buffers already: its copy is not to be read.
    if (gave_up < 0) gave_up = segments->first_peer_gave_up();
    if (gave_up >= 0) {
      return "rank " + std::to_string(segments->label(gave_up)) +
             " gave up (see its error) while this rank waited for its node";
    }
    if (started) return "";
    return core::detail::concat("waited more than ", timeout_seconds, " s for bucket ", index,
                                " (round ", round_of(index), "): rank(s) ",
                                segments->behind(index, /*finished=*/false),
                                " of this node have not started it");
  }

  template <typename T>
  std::vector<T*> node_copies(size_t index) const {
    std::vector<T*> copies;
    if (segments) {
      for (int q = 0; q < local_size; ++q) {
        copies.push_back(reinterpret_cast<T*>(segments->copy(q, index)));
      }
    } else {
      copies.push_back(static_cast<T*>(own_buffers[index].data_ptr()));
    }
    return copies;
  }

  const core::Tensor& own_buffer(size_t index) const {
    return segments ? segments->buffer(index) : own_buffers[index];
  }

  // The node's shard `local` of buffer `index`.
  std::pair<int64_t, int64_t> node_shard(size_t index, int local) const {
    return segments ? segments->shard(index, local)
                    : std::pair<int64_t, int64_t>{0, specs[index].numel};
  }
  std::pair<int64_t, int64_t> own_shard(size_t index) const {
    return node_shard(index, local_rank);
  }
  // ZeRO-1's shard of `rank`: piece `node` of its local rank's node shard.
  std::pair<int64_t, int64_t> zero_shard(size_t index, int owner) const {
    const auto [begin, end] = node_shard(index, local_rank_of[size_t(owner)]);
    const int64_t piece = (end - begin) / nodes;
    const int64_t first = begin + piece * node_of[size_t(owner)];
    return {first, first + piece};
  }

  // `values` (this rank's node sum) as the link carries it: itself, or rounded to the wire dtype
  // into a reused scratch tensor.
  core::Tensor on_the_wire(const core::Tensor& values) {
    if (!wire || *wire == values.dtype()) return values;
    if (!wire_piece.defined() || wire_piece.numel() < values.numel()) {
      wire_piece = core::empty({values.numel()}, *wire);
    }
    core::Tensor rounded = wire_piece.narrow(0, 0, values.numel());
    convert_elements(values, rounded);
    return rounded;
  }

  // Step 2 on one piece: the sum of `values` over the nodes, in place, in the wire dtype when
  // compressing (see the header).
  void all_reduce_across_nodes(const core::Tensor& values) {
    const core::Tensor sent = on_the_wire(values);
    all_reduce_across(sent, ReduceOp::Sum);
    if (!sent.is_same(values)) convert_elements(sent, values);
  }

  // ZeRO-1's collectives on this rank's node shard, whole (its pieces per node must be
  // contiguous): ReduceScatter sums it in the node, reduce-scatters it across the nodes and
  // keeps this rank's piece, averaged, in its own copy; AllGather all-gathers the pieces across
  // the nodes into its own copy and copies the node shard into the node's other copies.
  template <typename T>
  void process_shard(size_t index, BucketCollective collective, const std::vector<T*>& copies) {
    using C = kernels::compute_t<T>;
    const auto [begin, end] = own_shard(index);
    const auto [first, last] = zero_shard(index, rank);
    const core::Tensor& buffer = own_buffer(index);
    T* own = copies[size_t(local_rank)];
    if (collective == BucketCollective::ReduceScatter) {
      sum_shard(copies, size_t(local_rank), begin, end);
      core::Tensor piece = buffer.narrow(0, first, last - first);
      if (nodes > 1) {
        const core::Tensor sent = on_the_wire(buffer.narrow(0, begin, end - begin));
        // No zero fill: the reduce-scatter writes every element (and a fill here would be a
        // core op on this thread, see convert_elements).
        piece = core::empty({last - first}, sent.dtype());
        reduce_scatter_across(sent, piece);
        if (piece.dtype() != buffer.dtype()) {
          core::Tensor widened = core::empty({last - first}, buffer.dtype());
          convert_elements(piece, widened);
          piece = widened;
        }
      }
      const T* sum = static_cast<const T*>(piece.data_ptr());
      const C scale = C(1.0 / double(size));
      for (int64_t i = 0; i < last - first; ++i) own[first + i] = T(C(sum[i]) * scale);
      return;
    }
    if (nodes > 1) {
      core::Tensor piece = buffer.narrow(0, first, last - first).clone();
      all_gather_across(piece, buffer.narrow(0, begin, end - begin));
    }
    copy_shard(copies, size_t(local_rank), begin, end);
  }

  void process(size_t index, BucketCollective collective) {
    const uint64_t round = round_of(index);
    if (index == 0) next_in_pass = 0;  // a new pass over the buckets
    if (index != next_in_pass) {
      std::lock_guard<std::mutex> lock(mutex);
      record_failure_locked("bucket " + std::to_string(index) + " was started out of order (" +
                                std::to_string(next_in_pass) + " was next)",
                            1 + world_rank);
      return;
    }
    std::string local_failure = segments ? await_node_started(index) : "";
    if (!local_failure.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      record_failure_locked(local_failure, 1 + world_rank);
    }
    const int32_t mine = local_failure.empty() ? 0 : failed_rank_code;
    int32_t status = exchange_status(mine, round);
    if (status == kRoundsDiffer) {
      std::lock_guard<std::mutex> lock(mutex);
      record_failure_locked("the nodes are out of step: they started different rounds of bucket " +
                                std::to_string(index) + " (this rank: round " +
                                std::to_string(round) +
                                "); did a backward fail on only some "
                                "ranks?",
                            1 + world_rank);
      status = failed_rank_code;
    } else if (status != 0 && local_failure.empty()) {
      std::lock_guard<std::mutex> lock(mutex);
      record_failure_locked("rank " + std::to_string(status - 1) +
                                " gave up (see its error) while this rank averaged bucket " +
                                std::to_string(index) + " (round " + std::to_string(round) +
                                ") with the other nodes",
                            status);
    }
    if (status != 0) {
      poison_rest_of_pass(status);
      return;
    }
    // Piece by piece, so each piece is summed in the node, all-reduced across the nodes and
    // spread in the node while it is still in cache.
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const std::pair<int64_t, int64_t> shard = own_shard(index);
    const int64_t begin = shard.first, end = shard.second;
    const core::DType dtype = specs[index].dtype;
    const int64_t piece = piece_elements(dtype);
    core::NoGradGuard no_grad;
    kernels::visit_floating(dtype, [&](auto zero) {
      const std::vector<decltype(zero)*> copies = node_copies<decltype(zero)>(index);
      if (collective != BucketCollective::Average) {
        process_shard(index, collective, copies);
        return;
      }
      for (int64_t first = begin; first < end; first += piece) {
        const int64_t last = std::min(end, first + piece);
        sum_shard(copies, size_t(local_rank), first, last);
        if (nodes > 1) all_reduce_across_nodes(own_buffer(index).narrow(0, first, last - first));
        spread_shard(copies, size_t(local_rank), first, last, 1.0 / double(size));
      }
    });
    if (segments) segments->publish_finished(index);
    std::lock_guard<std::mutex> lock(mutex);
    done_round[index] = round;
    wake_main.notify_all();
  }
};

HierarchicalAllReduce::HierarchicalAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  std::future<int> nice = impl_->thread_nice.get_future();
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  impl_->nice = nice.get();
}

int HierarchicalAllReduce::thread_nice() const {
  return impl_->nice;
}

LinkWait HierarchicalAllReduce::link_wait() const {
  return impl_->link_wait;
}

double HierarchicalAllReduce::thread_cpu_seconds() const {
  clockid_t clock{};
  timespec used{};
  const int rc = pthread_getcpuclockid(impl_->thread.native_handle(), &clock);
  MPIGRAD_CHECK(rc == 0 && clock_gettime(clock, &used) == 0, impl_->where(),
                ": cannot read the communication thread's CPU clock (",
                std::strerror(rc != 0 ? rc : errno), ")");
  return double(used.tv_sec) + double(used.tv_nsec) * 1e-9;
}

HierarchicalAllReduce::~HierarchicalAllReduce() {
  Impl& s = *impl_;
  // Other ranks may still be reading or writing this rank's copies: finish what is in flight.
  if (!s.failed.load()) {
    for (size_t b = 0; b < s.in_flight.size(); ++b) {
      try {
        wait(b);
      } catch (const core::Error&) {
        break;  // failed, and told the others
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
  }
  s.wake_thread.notify_all();
  // The thread is idle, or owes the other nodes status words (they will take them, or their
  // watchdog ends the job).
  if (s.thread.joinable()) s.thread.join();
}

std::unique_ptr<HierarchicalAllReduce> HierarchicalAllReduce::create(
    Communicator& communicator, std::unique_ptr<Communicator> node,
    std::span<const SharedBufferSpec> buffers, double timeout_seconds, std::string* why_not,
    std::optional<core::DType> wire, LinkWait link_wait) {
  MPIGRAD_CHECK(node != nullptr && communicator.size() % node->size() == 0,
                communicator.world_label(), " HierarchicalAllReduce on communicator '",
                communicator.name(), "': needs this rank's node, every node with as many ranks");
  auto* mpi = dynamic_cast<MpiCommunicator*>(&communicator);
  if (mpi == nullptr) {  // every rank holds the same kind of communicator
    if (why_not) *why_not = "the communicator is not an MpiCommunicator";
    return nullptr;
  }
  // 1. The communication thread calls MPI while the main thread does: every rank must have
  //    MPI_THREAD_MULTIPLE, which DistributedManager::initialize asks for; a host code that hands
  //    over its communicator decides it with its own MPI_Init_thread.
  const ThreadLevel level = mpi->runtime()->thread_level();
  if (all_reduce_min(communicator, level == ThreadLevel::Multiple ? 1 : 0) == 0) {
    if (why_not) {
      *why_not = "MPI provides " +
                 (level == ThreadLevel::Multiple
                      ? std::string("less than MPI_THREAD_MULTIPLE on another rank")
                      : std::string(thread_level_name(level)) + " here") +
                 " and the communication thread needs MPI_THREAD_MULTIPLE: initialize MPI "
                 "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)";
    }
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.communicator_name = communicator.name();
  s.rank = communicator.rank();
  s.size = communicator.size();
  s.world_rank = communicator.world_rank();
  s.label = communicator.world_label();
  s.local_rank = node->rank();
  s.local_size = node->size();
  s.nodes = s.size / s.local_size;
  s.timeout_seconds = timeout_seconds;
  MPIGRAD_CHECK(!wire || *wire == core::kBFloat16 || *wire == core::kFloat16, s.label,
                " HierarchicalAllReduce: the wire dtype must be bfloat16 or float16, got ", *wire);
  s.wire = wire;
  s.link_wait = link_wait;

  // 2. The inter-node group of this local rank, ordered by rank. Its name lists its (world)
  //    ranks, so its watchdog's reports can be told from the other groups'.
  const std::vector<int> local_ranks = gather_ranks(communicator, s.local_rank);
  std::vector<int> cross_ranks;
  std::vector<int> seen(size_t(s.local_size), 0);
  for (int r = 0; r < s.size; ++r) {
    // The inter-node groups order their ranks by rank (split's key), so this is r's rank there.
    s.local_rank_of.push_back(local_ranks[size_t(r)]);
    s.node_of.push_back(seen[size_t(local_ranks[size_t(r)])]++);
    if (local_ranks[size_t(r)] == s.local_rank) {
      cross_ranks.push_back(communicator.world_rank_of(r));
    }
  }
  s.cross = communicator.split(s.local_rank, s.rank,
                               communicator.name() + " inter-node, local rank " +
                                   std::to_string(s.local_rank) + " (ranks " +
                                   join_ranks(cross_ranks) + ")");

  // 3. The buffers: the node's shared copies, or plain memory for a node of one rank.
  for (const SharedBufferSpec& spec : buffers) {
    MPIGRAD_CHECK(core::is_floating(spec.dtype) && spec.numel >= 0, s.label,
                  " HierarchicalAllReduce: buffers must have a floating dtype and numel >= 0, "
                  "got ",
                  spec.dtype, " x ", spec.numel);
    s.specs.push_back({spec.dtype, padded_numel(spec.numel, spec.dtype, s.size)});
  }
  std::string node_why_not;
  if (s.local_size > 1) {
    // It names the node's ranks by their world ranks.
    s.segments = SharedSegments::create(*node, s.specs, &node_why_not);
  } else {
    for (const SharedBufferSpec& spec : s.specs) {
      s.own_buffers.push_back(core::zeros({spec.numel}, spec.dtype));
    }
  }
  const bool here = s.local_size == 1 || s.segments != nullptr;
  if (all_reduce_min(communicator, here ? 1 : 0) == 0) {
    if (why_not) {
      *why_not = here ? "another node could not set up its shared memory"
                      : "this node could not set up its shared memory: " + node_why_not;
    }
    return nullptr;
  }
  s.in_flight.assign(s.specs.size(), false);
  s.rounds.assign(s.specs.size(), 0);
  s.done_round.assign(s.specs.size(), 0);
  return std::unique_ptr<HierarchicalAllReduce>(new HierarchicalAllReduce(std::move(impl)));
}

int HierarchicalAllReduce::nodes() const {
  return impl_->nodes;
}
int HierarchicalAllReduce::ranks_per_node() const {
  return impl_->local_size;
}
size_t HierarchicalAllReduce::buffer_count() const {
  return impl_->specs.size();
}
const core::Tensor& HierarchicalAllReduce::buffer(size_t index) const {
  return impl_->own_buffer(index);
}
bool HierarchicalAllReduce::in_flight(size_t index) const {
  return impl_->in_flight.at(index);
}

std::pair<int64_t, int64_t> HierarchicalAllReduce::shard(size_t index, int rank) const {
  return impl_->zero_shard(index, rank);
}

void HierarchicalAllReduce::start(size_t index, BucketCollective collective) {
  Impl& s = *impl_;
  s.check_usable();
  MPIGRAD_CHECK(index < s.specs.size() && !s.in_flight[index], s.label,
                " HierarchicalAllReduce::start: bucket ", index,
                index < s.specs.size() ? " is already in flight" : " does not exist");
  s.in_flight[index] = true;
  if (s.segments) {
    s.segments->publish_started(index);
  } else {
    ++s.rounds[index];
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.queue.emplace_back(index, collective);
  s.wake_thread.notify_one();
}

void HierarchicalAllReduce::wait(size_t index) {
  Impl& s = *impl_;
  s.check_usable();
  if (!s.in_flight.at(index)) return;
  const uint64_t round = s.round_of(index);
  {
    // No timeout here: the thread either fails within the node's timeout, or is inside an
    // inter-node collective, which the inter-node communicator's watchdog times.
    std::unique_lock<std::mutex> lock(s.mutex);
    s.wake_main.wait(lock, [&] { return s.done_round[index] == round || !s.failure.empty(); });
    if (!s.failure.empty()) throw core::Error(s.failure);
  }
  if (s.segments) {
    SharedSegments& segments = *s.segments;
    bool finished = SharedSegments::poll_until(
        [&] { return segments.all_finished(index); }, s.timeout_seconds,
        [&] {
          if (int q = segments.first_peer_gave_up(); q >= 0) {
            s.fail_from_main("rank ", segments.label(q),
                             " gave up (see its error) while this rank waited for its node");
          }
        });
    if (!finished) {
      s.fail_from_main("waited more than ", s.timeout_seconds, " s for bucket ", index, " (round ",
                       round, "): rank(s) ", segments.behind(index, true),
                       " of this node have not finished their share");
    }
  }
  s.in_flight[index] = false;
}

}  // namespace mpigrad::launch
