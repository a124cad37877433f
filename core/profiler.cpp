#include "mpigrad/core/profiler.h"

#include <mutex>
#include <string>
#include <unordered_set>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

namespace detail {
std::atomic<int> profile_sessions{0};
}  // namespace detail

namespace {
thread_local ProfileSession* thread_session = nullptr;
}  // namespace

const char* profile_kind_name(ProfileKind kind) {
  switch (kind) {
    case ProfileKind::Op:
      return "op";
    case ProfileKind::Kernel:
      return "kernel";
    case ProfileKind::Backward:
      return "backward";
    case ProfileKind::OnnxNode:
      return "onnx";
    case ProfileKind::Optimizer:
      return "optimizer";
    case ProfileKind::Phase:
      return "phase";
  }
  return "?";
}

ProfileSession::ProfileSession(ProfileSink& sink) : sink_(sink), started_ns_(profile_clock_ns()) {
  MPIGRAD_CHECK(thread_session == nullptr,
                "ProfileSession: this thread already records into another session; end it first");
  open_.reserve(64);
  thread_session = this;
  detail::profile_sessions.fetch_add(1, std::memory_order_relaxed);
}

ProfileSession::~ProfileSession() {
  detail::profile_sessions.fetch_sub(1, std::memory_order_relaxed);
  if (thread_session == this) thread_session = nullptr;
}

ProfileSession* ProfileSession::current() noexcept {
  return thread_session;
}

void ProfileSession::begin(const char* name, ProfileKind kind, const char* detail, double flops,
                           int64_t now_ns) noexcept {
  try {
    open_.push_back(Open{name, detail, kind, now_ns, 0, flops});
  } catch (...) {
    // Out of memory for one more level: the span goes unrecorded, and end() must know it.
    ++unrecorded_;
  }
}

void ProfileSession::end(int64_t now_ns) noexcept {
  if (unrecorded_ > 0) {
    --unrecorded_;
    return;
  }
  if (open_.empty()) return;
  const Open span = open_.back();
  open_.pop_back();
  const int64_t total = now_ns - span.begin_ns;
  if (!open_.empty()) {
    open_.back().child_ns += total;
    open_.back().flops += span.flops;
  }
  sink_.record(ProfileEvent{span.name, span.detail, span.kind, int32_t(open_.size()), span.begin_ns,
                            now_ns, total - span.child_ns, span.flops});
}

void ProfileSession::pause(int64_t now_ns) noexcept {
  if (pause_depth_++ == 0) paused_since_ns_ = now_ns;
}

void ProfileSession::resume(int64_t now_ns) noexcept {
  if (pause_depth_ > 0 && --pause_depth_ == 0) paused_ns_ += now_ns - paused_since_ns_;
}

bool ProfileSpan::recording_here() noexcept {
  const ProfileSession* session = thread_session;
  return session != nullptr && !session->paused();
}

ProfileSession* ProfileSpan::start(const char* name, ProfileKind kind, const char* detail,
                                   double flops) noexcept {
  ProfileSession* session = thread_session;
  if (session == nullptr || session->paused()) return nullptr;
  session->begin(name, kind, detail, flops, profile_clock_ns());
  return session;
}

const char* ProfileSpan::intern(std::string_view name) noexcept {
  try {
    return intern_profile_name(name);
  } catch (...) {
    return "(unnamed)";
  }
}

const char* intern_profile_name(std::string_view name) {
  // Never destroyed: a name handed out may be read by a sink during static destruction.
  static auto* names = new std::unordered_set<std::string>();
  static auto* lock = new std::mutex();
  std::lock_guard<std::mutex> guard(*lock);
  return names->emplace(name).first->c_str();
}

}  // namespace mpigrad::core
