// The collective timeout: a per-communicator thread that detects a wait past the timeout, asks
// the other ranks where they are, prints one report and aborts the job. See the header.
#include "mpigrad/launch/comm/collective_watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {
constexpr int kQueryTag = 7301;  // payload: the asker's nonce, echoed in the reply
constexpr int kReplyTag = 7302;  // payload: Reply

// A reply has a fixed size, so it is one MPI_BYTE message that the asker receives without
// probing its length, and small enough (about 1 KiB) to be sent eagerly.
constexpr int kMaxWaits = 4;       // this process's blocking waits reported (threads x comms)
constexpr int kMaxWaitedFor = 16;  // ranks named per wait
constexpr int kOpBytes = 24;
constexpr int kNameBytes = 96;

// One blocking wait of the answering process, on any of its communicators.
struct WaitRecord {
  int64_t seq = 0;
  int64_t waited_ms = -1;  // -1: its watchdog has not seen it yet
  int64_t bytes = 0;
  int32_t on_asked_communicator = 0;
  int32_t on_gpu = 0;            // queued on a GPU stream, not a host wait
  int32_t waited_for_known = 0;  // its watchdog asked that communicator's ranks (a probe)
  int32_t waited_for_count = 0;  // how many ranks it waits for; the first kMaxWaitedFor follow
  int32_t gone_mask = 0;         // bit i: waited_for[i] did not answer the probe
  int32_t waited_for[kMaxWaitedFor] = {};  // world ranks
  int32_t unused = 0;
  char op[kOpBytes] = {};
  char communicator[kNameBytes] = {};
};

struct Reply {
  int64_t nonce = -1;
  int64_t started = -1;  // how many collectives this rank has started on the asked communicator
  int32_t wait_count = 0;
  int32_t unused = 0;
  WaitRecord waits[kMaxWaits];
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <size_t N>
void copy_text(char (&to)[N], const char* from) {
  std::strncpy(to, from, N - 1);
  to[N - 1] = '\0';
}

// A world rank and whether it failed to answer.
struct WaitedFor {
  int world_rank = 0;
  bool gone = false;
};
}  // namespace

struct CollectiveWatchdog::Impl {
  MPI_Comm control = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::string name;
  std::shared_ptr<const WorldRanks> world;
  double timeout_seconds = 0;
  bool can_query_ranks = false;

  std::atomic<uint64_t> started{0};
  // What the main thread is blocked in: wait_token is sequence + 1, or 0 when it is not blocked.
  // The main thread never reads a clock (that would cost more than the rest of the bookkeeping
  // on an 8-byte all-reduce); the watchdog timestamps a wait when it first sees it, so the
  // timeout is measured to within one polling interval.
  std::atomic<uint64_t> wait_token{0};
  std::atomic<const char*> wait_op{""};
  std::atomic<int64_t> wait_bytes{0};
  // Written by this watchdog's thread; read by the other watchdogs' threads when they answer.
  std::atomic<uint64_t> seen_token{0};
  std::atomic<int64_t> seen_since_ns{0};
  // Whom this rank waits for in wait `probed_token`, found by asking this communicator's ranks.
  std::mutex probe_mutex;
  uint64_t probed_token = 0;
  std::vector<WaitedFor> waited_for;

  // The oldest collective queued on the GPU and not complete (QueuedCollectives): written by
  // this watchdog's thread, which times it, and read by the others' when they answer.
  QueuedCollectives* queued = nullptr;  // guarded by `mutex`
  std::atomic<uint64_t> gpu_token{0};   // its sequence + 1, or 0
  std::atomic<int64_t> gpu_since_ns{0};
  std::atomic<const char*> gpu_op{""};
  std::atomic<int64_t> gpu_bytes{0};

  // Watchdog-thread only: the nonce of the last query, and the payloads of sends that may never
  // complete (to a dead rank); a pending send's buffer must stay untouched.
  int64_t last_nonce = 0;
  std::list<int64_t> query_payloads;

  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;

  // Every watchdog of this process, so that any of them can answer for all of this rank's waits:
  // a rank asked over communicator A may be blocked on B. Touched at construction, destruction
  // and when answering, never on the hot path. Leaked on purpose: a watchdog may be destroyed
  // during static destruction.
  static std::mutex& registry_mutex() {
    static auto* mutex = new std::mutex;
    return *mutex;
  }
  static std::vector<Impl*>& registry() {
    static auto* watchdogs = new std::vector<Impl*>;
    return *watchdogs;
  }

  int64_t waited_ms(uint64_t token) const {
    if (token != seen_token.load(std::memory_order_acquire)) return -1;
    return (now_ns() - seen_since_ns.load(std::memory_order_relaxed)) / 1000000;
  }

  // This wait of this communicator as a record, or false when it is not blocked (a host wait, or
  // else a collective pending on the GPU).
  bool describe_wait(WaitRecord& record, bool asked) {
    const uint64_t token = wait_token.load(std::memory_order_acquire);
    if (token == 0) return describe_gpu_wait(record, asked);
    record.seq = int64_t(token - 1);
    record.waited_ms = waited_ms(token);
    record.bytes = wait_bytes.load(std::memory_order_relaxed);
    record.on_asked_communicator = asked ? 1 : 0;
    copy_text(record.op, wait_op.load(std::memory_order_relaxed));
    copy_text(record.communicator, name.c_str());
    std::lock_guard<std::mutex> lock(probe_mutex);
    if (probed_token == token) {
      record.waited_for_known = 1;
      record.waited_for_count = int32_t(waited_for.size());
      for (size_t i = 0; i < waited_for.size() && i < size_t(kMaxWaitedFor); ++i) {
        record.waited_for[i] = waited_for[i].world_rank;
        if (waited_for[i].gone) record.gone_mask |= int32_t(1u << i);
      }
    }
    return true;
  }

  bool describe_gpu_wait(WaitRecord& record, bool asked) const {
    const uint64_t token = gpu_token.load(std::memory_order_acquire);
    if (token == 0) return false;
    record.seq = int64_t(token - 1);
    record.waited_ms = (now_ns() - gpu_since_ns.load(std::memory_order_relaxed)) / 1000000;
    record.bytes = gpu_bytes.load(std::memory_order_relaxed);
    record.on_asked_communicator = asked ? 1 : 0;
    record.on_gpu = 1;
    copy_text(record.op, gpu_op.load(std::memory_order_relaxed));
    copy_text(record.communicator, name.c_str());
    return true;
  }

  // Where this rank is: the collectives started here, and every blocking wait of the process,
  // this communicator's first.
  Reply current_state(int64_t nonce) {
    Reply reply;
    reply.nonce = nonce;
    reply.started = int64_t(started.load(std::memory_order_relaxed));
    if (describe_wait(reply.waits[0], true)) reply.wait_count = 1;
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (Impl* other : registry()) {
      if (other == this || reply.wait_count == kMaxWaits) continue;
      if (other->describe_wait(reply.waits[reply.wait_count], false)) ++reply.wait_count;
    }
    return reply;
  }

  // Answers every pending "where are you?" from ranks whose own watchdog fired or probes.
  void answer_queries() {
    while (true) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, control, &flag, &status) != MPI_SUCCESS || !flag) {
        return;
      }
      int64_t nonce = 0;
      MPI_Recv(&nonce, 1, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, control, MPI_STATUS_IGNORE);
      Reply reply = current_state(nonce);
      // Eager-sized, so MPI_Send returns without the asker having posted its receive yet.
      MPI_Send(&reply, int(sizeof(Reply)), MPI_BYTE, status.MPI_SOURCE, kReplyTag, control);
    }
  }

  // Asks every other rank where it is and collects the answers that come within the grace.
  struct Gathered {
    std::vector<Reply> replies;
    std::vector<bool> answered;
  };
  Gathered gather() {
    Gathered result;
    result.replies.resize(size_t(size));
    result.answered.assign(size_t(size), false);
    const int64_t nonce = ++last_nonce;
    result.replies[size_t(rank)] = current_state(nonce);
    result.answered[size_t(rank)] = true;
    if (!can_query_ranks) return result;
    const int64_t& payload = query_payloads.emplace_back(nonce);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(&payload, 1, MPI_INT64_T, r, kQueryTag, control, &request) == MPI_SUCCESS) {
        MPI_Request_free(&request);
      }
    }
    // Long enough for every live watchdog to wake up and answer, short enough that the job
    // still ends well within twice the timeout.
    const double grace = std::clamp(timeout_seconds * 0.25, 0.3, 2.0);
    const int64_t deadline = now_ns() + int64_t(grace * 1e9);
    int pending = size - 1;
    while (pending > 0 && now_ns() < deadline) {
      answer_queries();  // other ranks are asking us at the same time
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, control, &flag, &status);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      Reply reply;
      MPI_Recv(&reply, int(sizeof(Reply)), MPI_BYTE, status.MPI_SOURCE, kReplyTag, control,
               MPI_STATUS_IGNORE);
      if (reply.nonce != nonce) continue;  // the late answer to an earlier probe
      if (!result.answered[size_t(status.MPI_SOURCE)]) --pending;
      result.answered[size_t(status.MPI_SOURCE)] = true;
      result.replies[size_t(status.MPI_SOURCE)] = reply;
    }
    return result;
  }

  // The ranks of this communicator, other than `self`, that have not started collective `seq`
  // or did not answer.
  std::vector<WaitedFor> not_arrived(const Gathered& gathered, uint64_t seq, int self) const {
    std::vector<WaitedFor> ranks;
    for (int r = 0; r < size; ++r) {
      if (r == self) continue;
      const bool gone = !gathered.answered[size_t(r)];
      if (gone || gathered.replies[size_t(r)].started <= int64_t(seq)) {
        ranks.push_back({world->of_member[size_t(r)], gone});
      }
    }
    return ranks;
  }

  // Asks this communicator's ranks, once per long wait, whom this rank is waiting for, so that a
  // report from another communicator (this rank blocked here is not arrived there) can say.
  void probe(uint64_t token) {
    Gathered gathered = gather();
    std::vector<WaitedFor> ranks = not_arrived(gathered, token - 1, rank);
    std::lock_guard<std::mutex> lock(probe_mutex);
    probed_token = token;
    waited_for = std::move(ranks);
  }

  // "rank 3 on node1"
  std::string named(int world_rank) const {
    const std::string host = world->host(world_rank);
    return "rank " + std::to_string(world_rank) + (host.empty() ? "" : " on " + host);
  }

  // ", on rank 3 on node1 (gone), rank 2 on node1"; empty when nobody (or unknown).
  std::string on_ranks(const std::vector<WaitedFor>& ranks, int32_t total) const {
    std::string text;
    for (const WaitedFor& r : ranks) {
      text += (text.empty() ? ", on " : ", ") + named(r.world_rank) + (r.gone ? " (gone)" : "");
    }
    if (total > int32_t(ranks.size())) {
      text += " and " + std::to_string(total - int32_t(ranks.size())) + " more";
    }
    return text;
  }

  // "waiting in all_reduce #0 on communicator 'odd' for 1200 ms, on rank 3 on node1 (gone)".
  // Whom a rank waits for on this communicator is known from the replies; on another, from that
  // communicator's probe, if it has run (after a quarter of the timeout).
  std::string waiting_text(const WaitRecord& record, const Gathered& gathered, int member) const {
    std::string text = std::string("waiting in ") + record.op + " #" + std::to_string(record.seq) +
                       " on communicator '" + record.communicator + "'" +
                       (record.on_gpu ? " (queued on the GPU)" : "");
    if (record.waited_ms >= 0) text += " for " + std::to_string(record.waited_ms) + " ms";
    if (record.on_asked_communicator) {
      std::vector<WaitedFor> ranks = not_arrived(gathered, uint64_t(record.seq), member);
      return text + on_ranks(ranks, int32_t(ranks.size()));
    }
    if (record.waited_for_known) {
      std::vector<WaitedFor> ranks;
      for (int i = 0; i < std::min(record.waited_for_count, kMaxWaitedFor); ++i) {
        ranks.push_back({record.waited_for[i], (record.gone_mask >> i & 1) != 0});
      }
      text += on_ranks(ranks, record.waited_for_count);
    }
    return text;
  }

  // `gpu_error`: null for a host wait; for a collective pending on the GPU, what the library
  // reports for it ("" if nothing).
  [[noreturn]] void report_and_abort(uint64_t seq, const char* op, int64_t bytes, double waited,
                                     const std::string* gpu_error = nullptr) {
    const Gathered gathered = gather();

    // Ranks by their world rank (rank r here is world rank of_member[r]). A rank that does not
    // answer is "gone": its watchdog thread answers whatever its main thread does, so only a
    // process that died or exited, or a node that cannot be reached, stays silent. A rank that
    // answers is alive, and says where each of its threads is blocked, on any communicator.
    std::string missing, arrived, details;
    int missing_count = 0;
    for (int r = 0; r < size; ++r) {
      const Reply& reply = gathered.replies[size_t(r)];
      const int world_rank = world->of_member[size_t(r)];
      const bool answered = gathered.answered[size_t(r)];
      const bool has_arrived = answered && reply.started > int64_t(seq);
      std::string& list = has_arrived ? arrived : missing;
      list += (list.empty() ? "" : ", ") + std::to_string(world_rank);
      if (has_arrived) continue;
      ++missing_count;
      details += "\n  " + named(world_rank) + ": ";
      if (!answered) {
        details += can_query_ranks
                       ? "gone (no answer: the process died or exited, or its node cannot be "
                         "reached)"
                       : "unknown (MPI thread level below MPI_THREAD_MULTIPLE)";
      } else if (reply.wait_count == 0) {
        details += "alive, not in a collective; has started " + std::to_string(reply.started) +
                   " collectives (needs " + std::to_string(seq + 1) + ")";
      } else {
        details += "alive, ";
        for (int w = 0; w < reply.wait_count; ++w) {
          details += (w == 0 ? "" : "; and ") + waiting_text(reply.waits[w], gathered, r);
        }
      }
    }
    // The host too: a timeout may involve several nodes.
    const std::string label = rank_label_on_host(world->of_member[size_t(rank)], world->size);
    const std::string where = gpu_error == nullptr ? "" : " on the GPU";
    const std::string library_error =
        gpu_error == nullptr || gpu_error->empty() ? "" : "; " + *gpu_error;
    const std::string aborting = queued == nullptr ? std::string("the job")
                                                   : std::string("its GPU collectives (") +
                                                         queued->abort_call() + ") and the job";
    std::fprintf(
        stderr,
        "%s mpigrad: collective timeout on communicator '%s': %s #%llu "
        "(%lld bytes) waited %.1f s%s (timeout %.1f s%s).\n"
        "  ranks not arrived: %s\n  ranks arrived: %s%s\n"
        "  aborting %s (MPI_Abort, exit code 3); raise MPIGRAD_COLLECTIVE_TIMEOUT if this "
        "collective is legitimately slow.\n",
        label.c_str(), name.c_str(), op, static_cast<unsigned long long>(seq),
        static_cast<long long>(bytes), waited, where.c_str(), timeout_seconds,
        library_error.c_str(),
        missing_count ? missing.c_str() : "none (all arrived; the library made no progress)",
        arrived.empty() ? "none" : arrived.c_str(), details.c_str(), aborting.c_str());
    std::fflush(stderr);
    if (queued != nullptr) abort_queued();
    abort_job(control, 3);
  }

  // Stops the GPU collectives before the job is ended, but never waits on that for long: an abort
  // that hangs (a library bug) must not keep the job from ending.
  void abort_queued() {
    std::atomic<bool> finished{false};
    std::thread aborter([this, &finished] {
      queued->abort();
      finished.store(true, std::memory_order_release);
    });
    const int64_t deadline = now_ns() + int64_t(10e9);
    while (!finished.load(std::memory_order_acquire) && now_ns() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (finished.load(std::memory_order_acquire)) {
      aborter.join();
    } else {
      std::fprintf(stderr, "  %s did not return within 10 s; ending the job regardless\n",
                   queued->abort_call());
      aborter.detach();  // this thread never returns (abort_job), so `finished` outlives it
    }
  }

  // Times the oldest collective queued on the GPU; reports it past the timeout.
  void check_queued() {
    QueuedCollectives::Pending pending;
    if (!queued->oldest_pending(pending)) {
      gpu_token.store(0, std::memory_order_release);
      return;
    }
    const uint64_t token = pending.sequence + 1;
    if (token != gpu_token.load(std::memory_order_relaxed)) {  // a new one: start its clock
      gpu_op.store(pending.op, std::memory_order_relaxed);
      gpu_bytes.store(pending.bytes, std::memory_order_relaxed);
      gpu_since_ns.store(now_ns(), std::memory_order_relaxed);
      gpu_token.store(token, std::memory_order_release);
      return;
    }
    const double waited = double(now_ns() - gpu_since_ns.load(std::memory_order_relaxed)) * 1e-9;
    if (waited > timeout_seconds) {
      report_and_abort(pending.sequence, pending.op, pending.bytes, waited, &pending.error);
    }
  }

  void run() {
    const double poll = std::clamp(timeout_seconds / 40.0, 0.005, 0.05);
    const auto interval = std::chrono::microseconds(int64_t(poll * 1e6));
    const double probe_after = timeout_seconds * 0.25;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      wake.wait_for(lock, interval);
      if (stop) break;
      if (can_query_ranks) answer_queries();
      if (queued != nullptr) check_queued();
      const uint64_t token = wait_token.load(std::memory_order_acquire);
      if (token == 0) continue;
      if (token != seen_token.load(std::memory_order_relaxed)) {  // a new wait: start its clock
        seen_since_ns.store(now_ns(), std::memory_order_relaxed);
        seen_token.store(token, std::memory_order_release);
        continue;
      }
      const double waited = double(now_ns() - seen_since_ns.load(std::memory_order_relaxed)) * 1e-9;
      if (can_query_ranks && size > 1 && waited > probe_after && probed_token != token) {
        probe(token);  // probed_token is written by this thread only
        continue;
      }
      if (waited <= timeout_seconds) continue;
      const char* op = wait_op.load(std::memory_order_relaxed);
      const int64_t bytes = wait_bytes.load(std::memory_order_relaxed);
      // Still the same wait? (The main thread may have finished it a moment ago.)
      if (wait_token.load(std::memory_order_acquire) != token) continue;
      report_and_abort(token - 1, op, bytes, waited);
    }
  }
};

CollectiveWatchdog::CollectiveWatchdog(const MpiCommHandle& control, std::string name,
                                       std::shared_ptr<const WorldRanks> world,
                                       double timeout_seconds, bool can_query_ranks)
    : impl_(std::make_unique<Impl>()) {
  impl_->control = control.comm;
  check_mpi(MPI_Comm_rank(control.comm, &impl_->rank), "MPI_Comm_rank", name);
  check_mpi(MPI_Comm_size(control.comm, &impl_->size), "MPI_Comm_size", name);
  MPIGRAD_CHECK(world != nullptr && int(world->of_member.size()) == impl_->size,
                "CollectiveWatchdog of '", name, "': no world ranks for its ", impl_->size,
                " ranks");
  impl_->world = std::move(world);
  impl_->name = std::move(name);
  impl_->timeout_seconds = timeout_seconds;
  impl_->can_query_ranks = can_query_ranks;
  {
    std::lock_guard<std::mutex> lock(Impl::registry_mutex());
    Impl::registry().push_back(impl_.get());
  }
  if (timeout_seconds > 0) impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  if (impl_->thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      impl_->stop = true;
    }
    impl_->wake.notify_all();
    impl_->thread.join();
  }
  std::lock_guard<std::mutex> lock(Impl::registry_mutex());
  auto& watchdogs = Impl::registry();
  watchdogs.erase(std::remove(watchdogs.begin(), watchdogs.end(), impl_.get()), watchdogs.end());
}

uint64_t CollectiveWatchdog::next_sequence() {
  // Only the thread issuing collectives writes this counter (MPI requires collectives on one
  // communicator to be issued in one order), so a plain load and store do; no locked increment.
  uint64_t sequence = impl_->started.load(std::memory_order_relaxed);
  impl_->started.store(sequence + 1, std::memory_order_relaxed);
  return sequence;
}

void CollectiveWatchdog::watch_queued(QueuedCollectives* queued) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->queued = queued;
  if (queued == nullptr) impl_->gpu_token.store(0, std::memory_order_release);
}

uint64_t CollectiveWatchdog::started() const {
  return impl_->started.load(std::memory_order_relaxed);
}

void CollectiveWatchdog::begin_wait(uint64_t sequence, const char* op, int64_t bytes) {
  impl_->wait_op.store(op, std::memory_order_relaxed);
  impl_->wait_bytes.store(bytes, std::memory_order_relaxed);
  impl_->wait_token.store(sequence + 1, std::memory_order_release);
}

void CollectiveWatchdog::end_wait() {
  impl_->wait_token.store(0, std::memory_order_release);
}

}  // namespace mpigrad::launch
