// The collective timeout: a per-communicator thread that detects a wait past the timeout, asks
// the other ranks where they are, prints one report and aborts the job. See the header.
#include "mpigrad/launch/comm/collective_watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {
constexpr int kQueryTag = 7301;  // payload: the sequence number the asking rank is stuck in
constexpr int kReplyTag = 7302;  // payload: Reply

struct Reply {
  int64_t started = -1;      // how many collectives this rank has started on the communicator
  int64_t waiting_seq = -1;  // the collective it is blocked in, or -1
  int64_t waited_ms = 0;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
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
  // Watchdog-thread only.
  uint64_t seen_token = 0;
  int64_t seen_since_ns = 0;

  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;

  Reply current_state() const {
    Reply reply;
    reply.started = int64_t(started.load(std::memory_order_relaxed));
    uint64_t token = wait_token.load(std::memory_order_acquire);
    if (token != 0) {
      reply.waiting_seq = int64_t(token - 1);
      reply.waited_ms = token == seen_token ? (now_ns() - seen_since_ns) / 1000000 : 0;
    }
    return reply;
  }

  // Answers every pending "where are you?" from ranks whose own watchdog fired.
  void answer_queries() {
    while (true) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, control, &flag, &status) != MPI_SUCCESS || !flag) {
        return;
      }
      int64_t asked_seq = 0;
      MPI_Recv(&asked_seq, 1, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, control,
               MPI_STATUS_IGNORE);
      Reply reply = current_state();
      // Eager-sized, so MPI_Send returns without the asker having posted its receive yet.
      MPI_Send(&reply, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, control);
    }
  }

  [[noreturn]] void report_and_abort(uint64_t seq, const char* op, int64_t bytes, double waited) {
    std::vector<Reply> replies(static_cast<size_t>(size));
    std::vector<bool> answered(size_t(size), false);
    replies[size_t(rank)] = current_state();
    answered[size_t(rank)] = true;
    if (can_query_ranks) {
      int64_t query = int64_t(seq);
      std::vector<MPI_Request> sends;
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        sends.emplace_back();
        MPI_Isend(&query, 1, MPI_INT64_T, r, kQueryTag, control, &sends.back());
      }
      // Long enough for every live watchdog to wake up and answer, short enough that the job
      // still ends well within twice the timeout.
      double grace = std::clamp(timeout_seconds * 0.25, 0.3, 2.0);
      int64_t deadline = now_ns() + int64_t(grace * 1e9);
      int pending = size - 1;
      while (pending > 0 && now_ns() < deadline) {
        answer_queries();  // other stuck ranks are asking us at the same time
        int flag = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, control, &flag, &status);
        if (!flag) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        Reply reply;
        MPI_Recv(&reply, 3, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, control, MPI_STATUS_IGNORE);
        if (!answered[size_t(status.MPI_SOURCE)]) --pending;
        answered[size_t(status.MPI_SOURCE)] = true;
        replies[size_t(status.MPI_SOURCE)] = reply;
      }
    }

    // Ranks by their world rank (rank r here is world rank of_member[r]). A rank that does not
    // answer is "gone": its watchdog thread answers whatever its main thread does, so only a
    // process that died or exited, or a node that cannot be reached, stays silent. A rank that
    // answers from inside another collective is alive and waiting, most likely on those.
    auto named = [&](int r) {
      const int world_rank = world->of_member[size_t(r)];
      const std::string host = world->host(world_rank);
      return "rank " + std::to_string(world_rank) + (host.empty() ? "" : " on " + host);
    };
    std::string gone;
    for (int r = 0; r < size; ++r) {
      if (!answered[size_t(r)]) gone += (gone.empty() ? "" : ", ") + named(r);
    }
    std::string missing, arrived, details;
    int missing_count = 0;
    for (int r = 0; r < size; ++r) {
      const Reply& reply = replies[size_t(r)];
      const int world_rank = world->of_member[size_t(r)];
      bool has_arrived = answered[size_t(r)] && reply.started > int64_t(seq);
      std::string& list = has_arrived ? arrived : missing;
      list += (list.empty() ? "" : ", ") + std::to_string(world_rank);
      if (has_arrived) continue;
      ++missing_count;
      details += "\n  " + named(r) + ": ";
      if (!answered[size_t(r)]) {
        details += can_query_ranks
                       ? "gone (no answer: the process died or exited, or its node cannot be "
                         "reached)"
                       : "unknown (MPI thread level below MPI_THREAD_MULTIPLE)";
      } else if (reply.waiting_seq >= 0) {
        details += "alive, waiting in collective #" + std::to_string(reply.waiting_seq) + " for " +
                   std::to_string(reply.waited_ms) + " ms" +
                   (gone.empty() ? "" : " (on the gone " + gone + ")");
      } else {
        details += "alive, not in a collective; has started " + std::to_string(reply.started) +
                   " collectives (needs " + std::to_string(seq + 1) + ")";
      }
    }
    // The host too: a timeout may involve several nodes.
    const std::string label = rank_label_on_host(world->of_member[size_t(rank)], world->size);
    std::fprintf(
        stderr,
        "%s mpigrad: collective timeout on communicator '%s': %s #%llu "
        "(%lld bytes) waited %.1f s (timeout %.1f s).\n"
        "  ranks not arrived: %s\n  ranks arrived: %s%s\n"
        "  aborting the job (MPI_Abort, exit code 3); raise MPIGRAD_COLLECTIVE_TIMEOUT if this "
        "collective is legitimately slow.\n",
        label.c_str(), name.c_str(), op, static_cast<unsigned long long>(seq),
        static_cast<long long>(bytes), waited, timeout_seconds,
        missing_count ? missing.c_str() : "none (all arrived; MPI made no progress)",
        arrived.empty() ? "none" : arrived.c_str(), details.c_str());
    std::fflush(stderr);
    abort_job(control, 3);
  }

  void run() {
    double poll = std::clamp(timeout_seconds / 40.0, 0.005, 0.05);
    auto interval = std::chrono::microseconds(int64_t(poll * 1e6));
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      wake.wait_for(lock, interval);
      if (stop) break;
      if (can_query_ranks) answer_queries();
      uint64_t token = wait_token.load(std::memory_order_acquire);
      if (token == 0) continue;
      if (token != seen_token) {  // a new wait: start its clock
        seen_token = token;
        seen_since_ns = now_ns();
        continue;
      }
      double waited = double(now_ns() - seen_since_ns) * 1e-9;
      if (waited <= timeout_seconds) continue;
      const char* op = wait_op.load(std::memory_order_relaxed);
      int64_t bytes = wait_bytes.load(std::memory_order_relaxed);
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
}

uint64_t CollectiveWatchdog::next_sequence() {
  // Only the thread issuing collectives writes this counter (MPI requires collectives on one
  // communicator to be issued in one order), so a plain load and store do; no locked increment.
  uint64_t sequence = impl_->started.load(std::memory_order_relaxed);
  impl_->started.store(sequence + 1, std::memory_order_relaxed);
  return sequence;
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
