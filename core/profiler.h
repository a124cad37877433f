// The per-op profiler's recording point: a scoped span that times one op, one backend kernel, one
// autograd node, one ONNX node, an optimizer step or a stage of the training loop, and hands it to
// whatever collects it (launch/observe/op_profile.h turns them into the table that `mpigrad train
// --profile` prints, and into trace spans).
//
// Cost. Off, a span is one relaxed load of a process-wide count of recording sessions and a
// predictable branch, in its constructor only; no clock is read and nothing is allocated, and a
// span's FLOP count or name is a lambda that is not called. On, a span reads steady_clock twice,
// pushes and pops one entry of its thread's stack and calls the sink once.
//
// Where spans go. A ProfileSession records the spans of the thread that made it, and of no other:
// loader threads and the workers of a multi-threaded kernel run inside the span of the thread
// that called them. Spans nest: each knows the time of the spans inside it (its self time is its
// total less theirs) and adds its FLOPs to the span around it, so an ONNX Conv node's span
// carries the FLOPs of the convolution kernel inside it, and a backward node those of its GEMMs.
//
// Names are `const char*` that must stay valid until the session's sink is done with them: string
// literals, or names owned by a model that outlives the session (an ONNX node's name). A name
// built at run time goes through the lambda form, which interns it (kept for the process).
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace mpigrad::core {

enum class ProfileKind : uint8_t {
  Op,         // a core op (matmul, add, copy)
  Kernel,     // a backend kernel whose FLOPs are counted (gemm, conv2d_forward)
  Backward,   // an autograd node's apply, by the node's name (MatmulBackward)
  OnnxNode,   // an ONNX graph node: the node's name, and its op type as the detail
  Optimizer,  // an optimizer's step or zero_grad
  Phase,      // a stage of the training loop: data wait, forward, backward, optimizer step
};

// "op", "kernel", "backward", "onnx", "optimizer", "phase".
const char* profile_kind_name(ProfileKind kind);

// One closed span, as a sink receives it (children before their parent).
struct ProfileEvent {
  const char* name;
  const char* detail;  // the ONNX op type; null when there is none
  ProfileKind kind;
  int32_t depth;             // spans open around it on its thread
  int64_t begin_ns, end_ns;  // profile_clock_ns()
  int64_t self_ns;           // end - begin, less the time of the spans nested in it
  double flops;              // its own and its nested spans' floating-point operations
};

class ProfileSink {
 public:
  virtual ~ProfileSink() = default;
  // Called on the recording thread; must not throw (what it cannot keep, it counts).
  virtual void record(const ProfileEvent& event) noexcept = 0;
};

inline int64_t profile_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace detail {
// How many sessions record on any thread: the off path reads only this.
extern std::atomic<int> profile_sessions;
}  // namespace detail

inline bool profiling_anywhere() noexcept {
  return detail::profile_sessions.load(std::memory_order_relaxed) != 0;
}

// Records the calling thread's spans into `sink` from construction to destruction. One session per
// thread at a time (a second is an error); spans opened in it must close before it ends, on its
// thread. begin/end are what ProfileSpan calls, public so that a test can drive a session with
// times of its own.
class ProfileSession {
 public:
  explicit ProfileSession(ProfileSink& sink);
  ~ProfileSession();
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;

  // This thread's session, or null.
  static ProfileSession* current() noexcept;

  void begin(const char* name, ProfileKind kind, const char* detail, double flops,
             int64_t now_ns) noexcept;
  void end(int64_t now_ns) noexcept;

  // While paused (ProfilePause), spans that begin are not recorded; spans already open are.
  bool paused() const { return pause_depth_ > 0; }
  void pause(int64_t now_ns) noexcept;
  void resume(int64_t now_ns) noexcept;
  int64_t paused_ns() const { return paused_ns_; }  // time spent paused, pauses ended so far
  int64_t started_ns() const { return started_ns_; }
  size_t open_spans() const { return open_.size(); }

 private:
  struct Open {
    const char* name;
    const char* detail;
    ProfileKind kind;
    int64_t begin_ns;
    int64_t child_ns;
    double flops;
  };
  ProfileSink& sink_;
  std::vector<Open> open_;
  int unrecorded_ = 0;  // spans begun while open_ could not grow, ended without a record
  int pause_depth_ = 0;
  int64_t paused_since_ns_ = 0, paused_ns_ = 0;
  int64_t started_ns_;
};

// A lambda giving a span's FLOPs, and one giving its name (a `const char*` that outlives the
// session, or a std::string, which is interned).
template <typename F>
concept FlopCount = std::invocable<F&> && std::is_arithmetic_v<std::invoke_result_t<F&>>;
template <typename F>
concept SpanName = std::invocable<F&> &&
    (std::is_convertible_v<std::invoke_result_t<F&>, const char*> ||
     std::is_convertible_v<std::invoke_result_t<F&>, std::string_view>);

// Times a scope into this thread's session, or does nothing when no session records.
//   ProfileSpan span("matmul");                                        // a core op
//   ProfileSpan span("gemm", ProfileKind::Kernel, [&] { return 2.0 * m * n * k; });  // FLOPs
//   ProfileSpan span(node.name.c_str(), ProfileKind::OnnxNode, node.op_type.c_str());
//   ProfileSpan span(ProfileKind::Backward, [&] { return node->name(); });  // named when on
class ProfileSpan {
 public:
  explicit ProfileSpan(const char* name, ProfileKind kind = ProfileKind::Op,
                       const char* detail = nullptr) noexcept {
    if (profiling_anywhere()) [[unlikely]]
      session_ = start(name, kind, detail, 0.0);
  }
  template <FlopCount CountFlops>
  ProfileSpan(const char* name, ProfileKind kind, CountFlops&& count_flops) noexcept {
    if (profiling_anywhere()) [[unlikely]] {
      if (recording_here()) session_ = start(name, kind, nullptr, double(count_flops()));
    }
  }
  template <SpanName MakeName>
  ProfileSpan(ProfileKind kind, MakeName&& make_name) noexcept {
    if (profiling_anywhere()) [[unlikely]] {
      if (!recording_here()) return;
      using Name = std::invoke_result_t<MakeName&>;
      if constexpr (std::is_convertible_v<Name, const char*>) {
        session_ = start(make_name(), kind, nullptr, 0.0);
      } else {
        session_ = start(intern(std::string_view(make_name())), kind, nullptr, 0.0);
      }
    }
  }
  ~ProfileSpan() {
    if (session_ != nullptr) [[unlikely]]
      session_->end(profile_clock_ns());
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  static bool recording_here() noexcept;
  static ProfileSession* start(const char* name, ProfileKind kind, const char* detail,
                               double flops) noexcept;
  static const char* intern(std::string_view name) noexcept;
  ProfileSession* session_ = nullptr;
};

// Stops this thread's session from recording new spans for a scope (the training loop's
// validation: the table covers training steps), and counts that time as not profiled.
class ProfilePause {
 public:
  ProfilePause() noexcept {
    if (profiling_anywhere()) [[unlikely]] {
      session_ = ProfileSession::current();
      if (session_ != nullptr) session_->pause(profile_clock_ns());
    }
  }
  ~ProfilePause() {
    if (session_ != nullptr) session_->resume(profile_clock_ns());
  }
  ProfilePause(const ProfilePause&) = delete;
  ProfilePause& operator=(const ProfilePause&) = delete;

 private:
  ProfileSession* session_ = nullptr;
};

// A copy of `name` kept for the life of the process; the same text gives the same pointer.
const char* intern_profile_name(std::string_view name);

// The FLOPs of the work a kernel does, counted as PyTorch's profiler and most papers count them:
// a multiply and an add are two.
inline double gemm_flops(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return 2.0 * double(batch) * double(m) * double(n) * double(k);
}
// A convolution's forward, and each of its backward passes (data, filter), which do as much work:
// every output element is a dot product over (in_channels / groups) * kernel_h * kernel_w.
inline double conv2d_flops(int64_t batch, int64_t out_channels, int64_t out_h, int64_t out_w,
                           int64_t in_channels_per_group, int64_t kernel_h, int64_t kernel_w) {
  return 2.0 * double(batch) * double(out_channels) * double(out_h) * double(out_w) *
         double(in_channels_per_group) * double(kernel_h) * double(kernel_w);
}

}  // namespace mpigrad::core
