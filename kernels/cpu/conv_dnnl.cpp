// CPU convolution on oneDNN (kernels/conv.h), and the rule that picks it, the GEMM path or the
// direct loops (depthwise, and stems of 1 to 4 input channels).
//
// Tensors arrive and leave as plain NCHW (x, y) and [out, in/groups, kh, kw] (w); each call
// reorders them to the blocked layouts oneDNN's direct kernels chose (format_tag::any) and back.
// Keeping the blocked layout across a run of layers would save those reorders; it is not done
// here. Building a primitive costs far more than running one on the small images of a training
// step, so each (pass, dtype, shape, thread count) gets its primitive and its reorders once, kept
// per thread as kernels/cpu/matmul_mixed.cpp keeps its matmuls. The blocked copies live in one
// scratch buffer per thread that grows to the largest convolution and is reused by every call.
// oneDNN runs on OpenMP with omp_get_max_threads() threads: the count core/threads.cpp set, or 1
// for a convolution too small to share (kSerialConvFlops), which then gives the same bits at
// every thread count; reorders of small tensors run on the calling thread alone
// (kSerialReorderBytes, more where the OpenMP workers sleep between regions). Float32 weights to
// and from OIhw16i16o, the forward weights and filter gradient of oneDNN's AVX-512 kernels, move
// through conv_weight_layout.h's copies instead of a reorder primitive: ResNet-18 at batch 8, 1
// thread, 42.4-44.7 -> 36.7-38.4 ms a step.
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "mpigrad/kernels/conv.h"
#include "mpigrad/kernels/cpu/conv_weight_layout.h"
#include "mpigrad/kernels/matmul.h"
#include "mpigrad/kernels/unsupported.h"

namespace mpigrad::kernels::cpu {
namespace {

using dnnl::memory;

// One engine for the process; a stream per thread, as the plans are per thread.
struct OneDnn {
  dnnl::engine& engine;
  dnnl::stream stream{engine};
};

OneDnn& onednn() {
  static dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  thread_local OneDnn instance{engine};
  return instance;
}

// ---- Threads ------------------------------------------------------------------------------------

// Below this many floating-point operations (2 x multiply-adds, padding taps counted) a call runs
// its primitive and reorders on the calling thread alone. Such a call lasts 5-50 us on one core,
// and its 3-4 OpenMP regions (reorder in, convolution, reorder out) cost more to fork, join and
// balance than the second core saves: in MobileNetV3-Small's training step its convolutions took
// 21 -> 27 us (forward) and 30 -> 39 us (filter gradient) a call from 1 to 2 threads. Where other
// processes share the cores each region's barrier can also wait a time slice for a preempted
// thread. 2-core VM, MobileNetV3-Small at 2 threads, one library with and without the threshold,
// A B A B: 10.3 -> 9.6 ms a step and 1.49 -> 1.22 s of CPU time a run on idle cores; 12.0
// -> 9.4-11.1 ms with OMP_WAIT_POLICY=passive and 31-64 -> 19-21 ms with a 10000-spin wait
// beside 1.2-1.8 cores of other work. ResNet-18's 3x3 convolutions (19-38 MFLOP) stay
// threaded: 1.9-2.1x.
constexpr double kSerialConvFlops = 4e6;

double conv_flops(const Conv2dShape& s) {
  const auto& g = s.geometry;
  return 2.0 * double(s.batch) * double(g.out_h * g.out_w) * double(s.out_channels) *
         double(g.channels / std::max<int64_t>(s.groups, 1)) * double(g.kernel_h * g.kernel_w);
}

// The thread count a convolution's primitive is built and run with.
int conv_threads(const Conv2dShape& s) {
  return conv_flops(s) < kSerialConvFlops ? 1 : omp_get_max_threads();
}

// Sets this thread's OpenMP count for a scope (oneDNN reads it when it builds a primitive and when
// it runs one) and puts the old one back.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : saved_(omp_get_max_threads()) {
    if (threads != saved_) omp_set_num_threads(threads);
  }
  ~ThreadScope() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

// ---- The path override --------------------------------------------------------------------------

ConvPath environment_path() {
  const char* value = std::getenv("MPIGRAD_CPU_CONV");
  if (value == nullptr || *value == '\0') return ConvPath::Rule;
  const std::string text(value);
  if (text == "gemm") return ConvPath::Gemm;
  if (text == "dnnl") return ConvPath::OneDnn;
  if (text == "direct") return ConvPath::Direct;
  throw std::invalid_argument("MPIGRAD_CPU_CONV=" + text +
                              " is not a convolution path: use gemm, dnnl or direct (or leave it "
                              "unset for the measured rule)");
}

std::atomic<ConvPath>& path_override() {
  static std::atomic<ConvPath> path{environment_path()};
  return path;
}

bool onednn_operand(DType operand) {
  if (operand == DType::Float32) return true;
  return operand == DType::BFloat16 && has_native_bf16();
}

// ---- Plans --------------------------------------------------------------------------------------

memory::data_type dnnl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return memory::data_type::f32;
    case DType::BFloat16:
      return memory::data_type::bf16;
    default:
      throw_unsupported("cpu", "conv2d_onednn", "", dtype);
  }
}

// One tensor of a call: its plain descriptor (the caller's pointer), the primitive's, and the
// reorder between them when they differ.
struct Operand {
  memory::desc plain, blocked;
  dnnl::reorder reorder;  // plain -> blocked for inputs, blocked -> plain for the output
  bool reordered = false;
  size_t scratch_offset = 0;  // of the blocked copy in the thread's scratch buffer
  // Weights [out, in, taps] whose reorder conv_weight_layout.h's copies run instead of `reorder`:
  // Float32 to or from OIhw16i16o, BFloat16 to the pair layouts (bf16_pairs says which).
  enum class WeightCopy { None, Float32Blocked, Bf16Pairs };
  WeightCopy weight_copy = WeightCopy::None;
  Bf16PairLayout bf16_pairs = Bf16PairLayout::InPairs;
  int64_t weight_out = 0, weight_in = 0, weight_taps = 0;
};

// Whether op's reorder is one conv_weight_layout.h copies (plain oihw, out and in whole blocks of
// 16), and which. The BFloat16 copies go one way, plain to blocked: inputs only.
void choose_weight_copy(Operand& op, bool input) {
  if (!op.reordered || !has_blocked_weight_copies()) return;
  const memory::dims dims = op.plain.dims();
  if (dims.size() != 4 || dims[0] % 16 != 0 || dims[1] % 16 != 0) return;
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  using WeightCopy = Operand::WeightCopy;
  const std::pair<tag, Bf16PairLayout> pair_layouts[] = {
      {tag::ABcd8b16a2b, Bf16PairLayout::InPairs},
      {tag::BAcd8a16b2a, Bf16PairLayout::OutPairsInOuter},
      {tag::ABcd8a16b2a, Bf16PairLayout::OutPairsOutOuter}};
  if (op.plain == memory::desc(dims, f32, tag::oihw) &&
      op.blocked == memory::desc(dims, f32, tag::OIhw16i16o)) {
    op.weight_copy = WeightCopy::Float32Blocked;
  } else if (input && op.plain == memory::desc(dims, bf16, tag::oihw)) {
    for (const auto& [format, layout] : pair_layouts) {
      if (op.blocked == memory::desc(dims, bf16, format)) {
        op.weight_copy = WeightCopy::Bf16Pairs;
        op.bf16_pairs = layout;
      }
    }
  }
  if (op.weight_copy == WeightCopy::None) return;
  op.weight_out = dims[0];
  op.weight_in = dims[1];
  op.weight_taps = dims[2] * dims[3];
}

struct Plan {
  dnnl::primitive primitive;
  Operand first, second,
      out;  // the pass's two inputs and its output, in the order of kernels/conv.h
  int first_arg = 0, second_arg = 0, out_arg = 0;
  // The bias the primitive adds (Forward) or whose gradient it writes (BackwardFilter): plain
  // [out_channels] of the output's dtype, read or written where the caller has it.
  bool bias = false;
  memory::desc bias_desc;
  int bias_arg = 0;
  size_t scratch_bytes = 0;
  bool reference = false;
  std::string implementation;
};

constexpr size_t kScratchAlign = 64;

void prepare_input(Operand& op, const memory::desc& blocked, const dnnl::engine& engine,
                   size_t& scratch) {
  op.blocked = blocked;
  op.reordered = blocked != op.plain;
  if (!op.reordered) return;
  op.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, op.plain, engine, blocked));
  op.scratch_offset = scratch;
  scratch += (blocked.get_size() + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

void prepare_output(Operand& op, const memory::desc& blocked, const dnnl::engine& engine,
                    size_t& scratch) {
  op.blocked = blocked;
  op.reordered = blocked != op.plain;
  if (!op.reordered) return;
  op.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, blocked, engine, op.plain));
  op.scratch_offset = scratch;
  scratch += (blocked.get_size() + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

struct Descriptors {
  memory::desc x_plain, w_plain, y_plain;  // the caller's layouts, input dtype
  memory::desc x_any, w_any, y_any;
  memory::desc bias;  // [out_channels] of the output's dtype
  memory::dims strides, dilations, padding;
};

// out_dtype applies to the pass's output only (y, grad_x or grad_w), the others are `operand`.
Descriptors descriptors(ConvPass pass, DType operand, DType out_dtype, const Conv2dShape& s) {
  const auto& g = s.geometry;
  const auto in_type = dnnl_type(operand), out_type = dnnl_type(out_dtype);
  const auto x_type = pass == ConvPass::BackwardData ? out_type : in_type;
  const auto w_type = pass == ConvPass::BackwardFilter ? out_type : in_type;
  const auto y_type = pass == ConvPass::Forward ? out_type : in_type;
  const memory::dims x_dims{s.batch, g.channels, g.height, g.width};
  const memory::dims y_dims{s.batch, s.out_channels, g.out_h, g.out_w};
  const bool grouped = s.groups > 1;
  const memory::dims w_dims =
      grouped ? memory::dims{s.groups, s.out_channels / s.groups, g.channels / s.groups, g.kernel_h,
                             g.kernel_w}
              : memory::dims{s.out_channels, g.channels, g.kernel_h, g.kernel_w};
  // [out, in/groups, kh, kw] is goihw with out = groups * (out/groups), the same bytes.
  const auto w_tag = grouped ? memory::format_tag::goihw : memory::format_tag::oihw;
  Descriptors d;
  d.x_plain = memory::desc(x_dims, x_type, memory::format_tag::nchw);
  d.w_plain = memory::desc(w_dims, w_type, w_tag);
  d.y_plain = memory::desc(y_dims, y_type, memory::format_tag::nchw);
  d.x_any = memory::desc(x_dims, x_type, memory::format_tag::any);
  d.w_any = memory::desc(w_dims, w_type, memory::format_tag::any);
  d.y_any = memory::desc(y_dims, y_type, memory::format_tag::any);
  d.bias = memory::desc({s.out_channels}, out_type, memory::format_tag::a);
  d.strides = {g.stride_h, g.stride_w};
  d.dilations = {g.dilation_h - 1, g.dilation_w - 1};  // oneDNN counts the gaps
  d.padding = {g.pad_h, g.pad_w};
  return d;
}

// The forward primitive descriptor, with a bias or without: the pass itself, or the hint a
// backward pass needs.
dnnl::convolution_forward::primitive_desc forward_pd(const Descriptors& d, bool bias,
                                                     const dnnl::engine& engine) {
  const auto kind = dnnl::prop_kind::forward_training;
  const auto direct = dnnl::algorithm::convolution_direct;
  if (bias) {
    dnnl::convolution_forward::desc desc(kind, direct, d.x_any, d.w_any, d.bias, d.y_any, d.strides,
                                         d.dilations, d.padding, d.padding);
    return dnnl::convolution_forward::primitive_desc(desc, engine);
  }
  dnnl::convolution_forward::desc desc(kind, direct, d.x_any, d.w_any, d.y_any, d.strides,
                                       d.dilations, d.padding, d.padding);
  return dnnl::convolution_forward::primitive_desc(desc, engine);
}

// The filter gradient's descriptor, with the bias's gradient or without.
dnnl::convolution_backward_weights::desc backward_weights_desc(const Descriptors& d, bool bias) {
  const auto direct = dnnl::algorithm::convolution_direct;
  if (bias) {
    return dnnl::convolution_backward_weights::desc(direct, d.x_any, d.w_any, d.bias, d.y_any,
                                                    d.strides, d.dilations, d.padding, d.padding);
  }
  return dnnl::convolution_backward_weights::desc(direct, d.x_any, d.w_any, d.y_any, d.strides,
                                                  d.dilations, d.padding, d.padding);
}

// One operand of a pass: its plain layout, the layout the primitive chose, and its argument.
struct Binding {
  memory::desc plain, blocked;
  int arg;
};

// The pass's two inputs and its output, with their reorders and scratch.
void bind_operands(Plan& plan, const dnnl::engine& engine, size_t& scratch, const Binding& first,
                   const Binding& second, const Binding& out) {
  plan.first.plain = first.plain;
  plan.second.plain = second.plain;
  plan.out.plain = out.plain;
  prepare_input(plan.first, first.blocked, engine, scratch);
  prepare_input(plan.second, second.blocked, engine, scratch);
  prepare_output(plan.out, out.blocked, engine, scratch);
  choose_weight_copy(plan.first, true);
  choose_weight_copy(plan.second, true);
  choose_weight_copy(plan.out, false);
  plan.first_arg = first.arg;
  plan.second_arg = second.arg;
  plan.out_arg = out.arg;
}

bool is_reference(const std::string& implementation) {
  return implementation.rfind("ref", 0) == 0;
}

// `bias`: the forward adds the bias, the filter gradient writes its gradient too (the data
// gradient has none).
Plan make_plan(ConvPass pass, DType operand, DType out_dtype, const Conv2dShape& s, bool bias) {
  const dnnl::engine& engine = onednn().engine;
  const Descriptors d = descriptors(pass, operand, out_dtype, s);
  // The hint of a backward pass: the forward of the same operands, all of the operand type.
  const Descriptors hint = descriptors(ConvPass::Forward, operand, operand, s);
  Plan plan;
  plan.bias = bias && pass != ConvPass::BackwardData;
  plan.bias_desc = d.bias;
  size_t scratch = 0;
  if (pass == ConvPass::Forward) {
    auto pd = forward_pd(d, plan.bias, engine);
    plan.bias_arg = DNNL_ARG_BIAS;
    plan.primitive = dnnl::convolution_forward(pd);
    plan.implementation = pd.impl_info_str();
    bind_operands(plan, engine, scratch, {d.x_plain, pd.src_desc(), DNNL_ARG_SRC},
                  {d.w_plain, pd.weights_desc(), DNNL_ARG_WEIGHTS},
                  {d.y_plain, pd.dst_desc(), DNNL_ARG_DST});
  } else if (pass == ConvPass::BackwardData) {
    auto hint_pd = forward_pd(hint, false, engine);
    dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, d.x_any,
                                               d.w_any, d.y_any, d.strides, d.dilations, d.padding,
                                               d.padding);
    dnnl::convolution_backward_data::primitive_desc pd(desc, engine, hint_pd);
    plan.primitive = dnnl::convolution_backward_data(pd);
    plan.implementation = pd.impl_info_str();
    bind_operands(plan, engine, scratch, {d.y_plain, pd.diff_dst_desc(), DNNL_ARG_DIFF_DST},
                  {d.w_plain, pd.weights_desc(), DNNL_ARG_WEIGHTS},
                  {d.x_plain, pd.diff_src_desc(), DNNL_ARG_DIFF_SRC});
  } else {
    auto hint_pd = forward_pd(hint, plan.bias, engine);
    dnnl::convolution_backward_weights::primitive_desc pd(backward_weights_desc(d, plan.bias),
                                                          engine, hint_pd);
    plan.primitive = dnnl::convolution_backward_weights(pd);
    plan.bias_arg = DNNL_ARG_DIFF_BIAS;
    plan.implementation = pd.impl_info_str();
    bind_operands(plan, engine, scratch, {d.x_plain, pd.src_desc(), DNNL_ARG_SRC},
                  {d.y_plain, pd.diff_dst_desc(), DNNL_ARG_DIFF_DST},
                  {d.w_plain, pd.diff_weights_desc(), DNNL_ARG_DIFF_WEIGHTS});
  }
  plan.scratch_bytes = scratch;
  plan.reference = is_reference(plan.implementation);
  return plan;
}

using PlanKey = std::array<int64_t, 20>;

const Plan& plan_for(ConvPass pass, DType operand, DType out_dtype, const Conv2dShape& s,
                     bool bias = false) {
  thread_local std::map<PlanKey, Plan> plans;
  const auto& g = s.geometry;
  const PlanKey key{int64_t(pass), int64_t(operand), int64_t(out_dtype),
                    s.batch,       g.channels,       g.height,
                    g.width,       s.out_channels,   s.groups,
                    g.kernel_h,    g.kernel_w,       g.stride_h,
                    g.stride_w,    g.pad_h,          g.pad_w,
                    g.dilation_h,  g.dilation_w,     omp_get_max_threads(),
                    g.out_h,       int64_t(bias)};
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  return plans.emplace(key, make_plan(pass, operand, out_dtype, s, bias)).first->second;
}

// ---- The rule ----------------------------------------------------------------------------------

// The measured choice (benchmarks/kernels/bench_conv_paths.cpp, 1 thread, the zoo's shapes at
// batch 8; docs/benchmarks.md, "Convolution paths", has the table). `direct` and `onednn` say
// which paths can take the case.
//  * depthwise: oneDNN where it has its depthwise kernel (jit_dw) for the pass, 5-50x the GEMM
//    path, which makes one tiny GEMM per channel. Where oneDNN has only its GEMM-based kernel
//    (most filter gradients, and forward on the late stages' 1x1 and 2x2 images with 5x5 and 7x7
//    kernels) the direct loops, 2-10x both GEMMs: they skip the taps that fall on padding.
//  * other grouped: oneDNN, 1.4-6x.
//  * dense kxk: oneDNN, 1.1-4x, the more the smaller the image; except the data gradient of a
//    stem (under 8 input channels), where oneDNN's kernel ran at 0.2-0.4x, and the unstrided
//    forward and filter gradient of 1 to 4 input channels (the Fashion-MNIST CNN's first layer,
//    grayscale and RGB stems at full resolution): the direct stem loops, 0.8-1.1x oneDNN's kernel
//    alone (batch 64, 1 thread, caches warm), without its reorders to and from the blocked layout
//    (a 3.2 MB output reordered after the MNIST CNN's first layer, 0.5 ms a step in training).
//    Strided stems stay on oneDNN, 1.4-2x the direct loops.
//  * 1x1 strided: oneDNN, 1.04-1.3x.
//  * 1x1 stride 1: the GEMM path reads NCHW as its matrix with no im2col, while oneDNN pays a
//    reorder of input and output to its blocked layout; that costs more than it saves on thin
//    layers (MobileNet's 16 -> 72 ran at 0.5x). oneDNN wins forward and data gradient once each
//    output value sums enough (channels * out / (channels + out) >= 48) over enough pixels
//    (batch * out_h * out_w >= 16): ResNet-50's 512 -> 128 and 1024 -> 256 at 1.2-4x. Its
//    filter gradient stays on GEMM (0.6-1.05x). In bfloat16 small images go to oneDNN (below).
ConvPath rule(ConvPass pass, DType operand, const Conv2dShape& s, bool direct, bool onednn) {
  const auto& g = s.geometry;
  if (is_depthwise(s)) {
    if (direct && onednn) {
      const std::string kernel = plan_for(pass, operand, DType::Float32, s).implementation;
      const bool gemm_based = kernel.find("gemm") != std::string::npos || is_reference(kernel);
      return gemm_based ? ConvPath::Direct : ConvPath::OneDnn;
    }
    if (direct) return ConvPath::Direct;
  }
  if (s.groups > 1) return ConvPath::OneDnn;
  const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1;
  if (!pointwise) {
    const bool stem = g.channels < 8;
    // The direct stem loops (1 to 4 input channels, forward and filter gradient) where unstrided.
    if (direct && g.stride_h == 1 && g.stride_w == 1) return ConvPath::Direct;
    return stem && pass == ConvPass::BackwardData ? ConvPath::Gemm : ConvPath::OneDnn;
  }
  if (g.stride_h > 1 || g.stride_w > 1 || g.pad_h > 0 || g.pad_w > 0) return ConvPath::OneDnn;
  // On 1x1 images the GEMM path runs one product over the whole batch (in bfloat16 too), which beat
  // oneDNN's convolution in every pass: EfficientNet-B0's 320 -> 1280 (`mpigrad-bench-conv-paths
  // --bf16`, 1 thread) 135 / 128 / 145 GFLOP/s against 64 / 73 / 23, and ResNet-50's bf16 step
  // went 75-76 -> 69-72 ms. Elsewhere in bfloat16 the GEMM path's product per image costs a
  // oneDNN matmul call each.
  const bool bf16 = operand == DType::BFloat16;
  const bool one_pixel = g.out_h * g.out_w == 1;
  if (one_pixel) return ConvPath::Gemm;
  if (pass == ConvPass::BackwardFilter) {
    // On images of 2 to 4 pixels the GEMM path's product per image is a rank-4 update that reads
    // and writes the whole weight gradient once for each image; oneDNN sums the batch in one
    // pass. ResNet-50's 1024 -> 256 on 2x2 (`mpigrad-bench-conv-paths`, batch 8): float32 28
    // against 64 GFLOP/s at 1 thread, 30 against 81 at 2; bfloat16 31-32 against 84, and 55-59
    // against 82-99.
    return g.out_h * g.out_w <= 4 ? ConvPath::OneDnn : ConvPath::Gemm;
  }
  const int64_t depth = g.channels * s.out_channels / (g.channels + s.out_channels);
  const int64_t pixels = s.batch * g.out_h * g.out_w;
  return depth >= 48 && (pixels >= 16 || bf16) ? ConvPath::OneDnn : ConvPath::Gemm;
}

// The thread's scratch for blocked copies: grows to the largest call and is kept.
class Scratch {
 public:
  char* reserve(size_t bytes) {
    if (bytes > capacity_) {
      buffer_.reset(static_cast<char*>(std::aligned_alloc(kScratchAlign, bytes)));
      if (!buffer_) throw std::bad_alloc();
      capacity_ = bytes;
    }
    return buffer_.get();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> buffer_;
  size_t capacity_ = 0;
};

// Reorders of small tensors run on the calling thread alone. Each oneDNN call is an OpenMP region
// of its own, and waking sleeping workers for one costs about as much as such a copy, far more
// where other processes share the cores: in the MNIST CNN's training step on 2 threads (its
// second convolution, ONEDNN_VERBOSE, a shared 2-core VM) the 18 KB weight reorders took
// 0.02-0.14 ms each, the 0.8 and 1.6 MB activations 0.13-0.26 and 0.17-0.24 ms (7-20 GB/s);
// on one thread 0.10-0.11 and 0.14-0.15 ms. So 2 MiB where the workers sleep between regions
// (OMP_WAIT_POLICY=passive, which core/threads.h picks on busy cores). Where they spin (free
// cores, GOMP_SPINCOUNT) a region starts in microseconds and 64 KB is enough: ResNet-18 at batch 8
// on 2 threads, whose 128-590 KB activations and weights then split, 23.0-24.0 -> 22.0-23.3 ms a
// step (idle 2-core VM, GOMP_SPINCOUNT=10000, alternated).
constexpr size_t kSerialReorderBytes = size_t(64) << 10;
constexpr size_t kSerialReorderBytesPassive = size_t(2) << 20;

// Whether OpenMP's idle workers sleep between parallel regions (libgomp reads OMP_WAIT_POLICY
// once, when it is loaded).
bool workers_sleep() {
  static const bool sleep = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy != nullptr &&
           (std::string(policy) == "passive" || std::string(policy) == "PASSIVE");
  }();
  return sleep;
}

void reorder(const Operand& op, dnnl::stream& stream, memory from, memory to) {
  switch (op.weight_copy) {
    case Operand::WeightCopy::None:
      break;
    case Operand::WeightCopy::Float32Blocked: {
      const auto* source = static_cast<const float*>(from.get_data_handle());
      auto* target = static_cast<float*>(to.get_data_handle());
      if (from.get_desc() == op.plain) {
        weights_to_blocked_16i16o(op.weight_out, op.weight_in, op.weight_taps, source, target);
      } else {
        weights_from_blocked_16i16o(op.weight_out, op.weight_in, op.weight_taps, source, target);
      }
      return;
    }
    case Operand::WeightCopy::Bf16Pairs:  // inputs only: plain to blocked
      bf16_weights_to_pairs(op.bf16_pairs, op.weight_out, op.weight_in, op.weight_taps,
                            static_cast<const uint16_t*>(from.get_data_handle()),
                            static_cast<uint16_t*>(to.get_data_handle()));
      return;
  }
  const size_t limit = workers_sleep() ? kSerialReorderBytesPassive : kSerialReorderBytes;
  const bool serial = op.plain.get_size() < limit;
  const ThreadScope threads(serial ? 1 : omp_get_max_threads());  // read at each execute
  op.reorder.execute(stream, from, to);
}

// `bias`: the plan's bias (read) or its gradient (written), where plan.bias.
void run(const Plan& plan, const void* first, const void* second, void* out, void* bias) {
  thread_local Scratch scratch;
  char* base = scratch.reserve(plan.scratch_bytes);
  OneDnn& dnn = onednn();
  auto plain_memory = [&](const Operand& op, const void* pointer) {
    return memory(op.plain, dnn.engine, const_cast<void*>(pointer));
  };
  auto used_memory = [&](const Operand& op, const memory& plain) {
    return op.reordered ? memory(op.blocked, dnn.engine, base + op.scratch_offset) : plain;
  };
  memory first_plain = plain_memory(plan.first, first);
  memory second_plain = plain_memory(plan.second, second);
  memory out_plain = plain_memory(plan.out, out);
  memory first_used = used_memory(plan.first, first_plain);
  memory second_used = used_memory(plan.second, second_plain);
  memory out_used = used_memory(plan.out, out_plain);
  if (plan.first.reordered) reorder(plan.first, dnn.stream, first_plain, first_used);
  if (plan.second.reordered) reorder(plan.second, dnn.stream, second_plain, second_used);
  std::unordered_map<int, memory> args{
      {plan.first_arg, first_used}, {plan.second_arg, second_used}, {plan.out_arg, out_used}};
  if (plan.bias) args.emplace(plan.bias_arg, memory(plan.bias_desc, dnn.engine, bias));
  plan.primitive.execute(dnn.stream, args);
  if (plan.out.reordered) reorder(plan.out, dnn.stream, out_used, out_plain);
  dnn.stream.wait();
}

void check_dtypes(DType operand, DType out_dtype) {
  const bool fp32 = operand == DType::Float32 && out_dtype == DType::Float32;
  const bool mixed = operand == DType::BFloat16 && out_dtype == DType::Float32;
  if (!fp32 && !mixed) {
    throw_unsupported("cpu", "conv2d_onednn", std::string("output dtype ") + dtype_name(out_dtype),
                      operand);
  }
}

[[noreturn]] void rethrow(const dnnl::error& e, const char* where) {
  throw std::runtime_error(std::string("mpigrad::kernels::cpu::") + where +
                           ": oneDNN: " + e.what());
}

}  // namespace

ConvPath set_conv2d_path_override(ConvPath path) {
  return path_override().exchange(path);
}

ConvPath conv2d_path(ConvPass pass, DType operand, const Conv2dShape& shape) {
  const bool onednn = onednn_operand(operand);
  const bool direct = has_direct_conv2d(pass, operand, shape);
  ConvPath path = path_override().load();
  try {
    // The rule reads the kernel of the plan the call will run, built with the call's threads.
    const ThreadScope threads(conv_threads(shape));
    if (path == ConvPath::Rule) path = rule(pass, operand, shape, direct, onednn);
  } catch (const dnnl::error& e) {
    rethrow(e, "conv2d_path");
  }
  if ((path == ConvPath::OneDnn && !onednn) || (path == ConvPath::Direct && !direct)) {
    return ConvPath::Gemm;
  }
  return path;
}

bool conv2d_onednn(ConvPass pass, DType operand, DType out_dtype, const Conv2dShape& shape,
                   const void* first, const void* second, void* out, const void* bias,
                   void* grad_bias) {
  check_dtypes(operand, out_dtype);
  if (operand == DType::BFloat16 && !has_native_bf16()) return false;
  if (shape.batch == 0) return false;  // nothing for oneDNN to do; the GEMM path's contract
  void* pass_bias = pass == ConvPass::Forward          ? const_cast<void*>(bias)
                    : pass == ConvPass::BackwardFilter ? grad_bias
                                                       : nullptr;
  try {
    const ThreadScope threads(conv_threads(shape));
    const Plan& plan = plan_for(pass, operand, out_dtype, shape, pass_bias != nullptr);
    if (plan.reference) return false;
    run(plan, first, second, out, pass_bias);
    return true;
  } catch (const dnnl::error& e) {
    rethrow(e, "conv2d_onednn");
  }
}

std::string conv2d_onednn_implementation(ConvPass pass, DType operand, DType out_dtype,
                                         const Conv2dShape& shape) {
  check_dtypes(operand, out_dtype);
  try {
    const ThreadScope threads(conv_threads(shape));
    return plan_for(pass, operand, out_dtype, shape).implementation;
  } catch (const dnnl::error& e) {
    rethrow(e, "conv2d_onednn_implementation");
  }
}

}  // namespace mpigrad::kernels::cpu
