// The CPU backend (forwards to kernels/cpu) and the device -> backend dispatch.
//
// Convolution runs on oneDNN's direct kernels or as im2col + GEMM, per shape family and pass as
// kernels::cpu::conv2d_path decides (kernels/conv.h). The GEMM path (CpuConv) runs one GEMM per
// image over the groups (1x1 stride-1 convolutions skip im2col, the image already being its
// column matrix, and on 1x1 images one GEMM takes the whole batch); backward recomputes each
// image's columns instead of saving them, so memory stays at one image's worth of columns.
#include "mpigrad/core/backend.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/kernels/neighbor_list.h"
#include "mpigrad/kernels/normalization.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::core {

namespace {

// Host scratch from the host allocator (aligned, cached) for the duration of one call.
class HostScratch {
 public:
  explicit HostScratch(size_t nbytes)
      : nbytes_(nbytes), ptr_(nbytes > 0 ? host_allocator().allocate(nbytes) : nullptr) {}
  ~HostScratch() {
    if (ptr_ != nullptr) host_allocator().deallocate(ptr_, nbytes_);
  }
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t nbytes_;
  void* ptr_;
};

// A convolution output up to this size (cache-resident) has its bias written in one threaded pass
// before the GEMM path's products; a larger one image by image, just before each product, while
// the image is in cache. The fills of small images are each too short to share between threads.
// Against the convolution followed by a separate add, alternated in one run, 2 threads: a 16 ->
// 72 1x1 at 16x16, batch 8 (590 KB), 1.11-1.30x the time with a fill per image, 0.89-0.90x with
// one fill (0.93-0.96x under bfloat16 autocast); a 64 -> 256 1x1 at 28x28, batch 8 (6.4 MB),
// 0.87x with a fill per image.
constexpr size_t kWholeBiasFillBytes = size_t(1) << 20;

// The convolution's loop over images and groups on the CPU. In mixed precision x, w and grad_y
// (and the columns made from them) are `operand`, 16-bit, and y, grad_x and grad_w `dtype`.
class CpuConv {
 public:
  CpuConv(DType dtype, const Conv2dShape& shape) : CpuConv(dtype, dtype, shape) {}
  CpuConv(DType dtype, DType operand, const Conv2dShape& shape)
      : dtype_(dtype),
        operand_(operand),
        s_(shape),
        g_(shape.geometry),
        element_(size_t(element_size(dtype))),
        operand_element_(size_t(element_size(operand))) {
    group_in_ = g_.channels / s_.groups;
    group_out_ = s_.out_channels / s_.groups;
    patch_ = group_in_ * g_.kernel_h * g_.kernel_w;
    out_area_ = g_.out_h * g_.out_w;
    direct_ = g_.kernel_h == 1 && g_.kernel_w == 1 && g_.stride_h == 1 && g_.stride_w == 1 &&
              g_.pad_h == 0 && g_.pad_w == 0;
  }

  // y[n][g] = W[g] columns[g] (+ bias), one GEMM per image over the groups. The bias (of dtype_;
  // null: none) is written into the image first and the product added to it (beta = 1), so it
  // costs BLAS no more than the zeros it writes for beta = 0, not a second pass over y. An output
  // of up to kWholeBiasFillBytes gets its bias in one pass before the first product instead.
  void forward(const void* x, const void* w, const void* bias, void* y) const {
    if (one_pixel()) {
      // y [batch, out] = x [batch, in] W^T: a fully connected layer, one product for the batch.
      if (bias != nullptr) {
        kernels::cpu::fill_channel_bias(dtype_, s_.batch, s_.out_channels, 1, bias, y);
      }
      product(packed_shape(s_.batch, s_.out_channels, g_.channels, false, true), x, w,
              bias != nullptr ? 1.0 : 0.0, y);
      return;
    }
    HostScratch columns(column_bytes(operand_element_));
    kernels::GemmShape shape = packed_shape(group_out_, out_area_, patch_, false, false);
    shape.batch = s_.groups;
    shape.batch_stride_a = group_out_ * patch_;
    shape.batch_stride_b = patch_ * out_area_;
    shape.batch_stride_c = group_out_ * out_area_;
    const bool whole =
        bias != nullptr &&
        size_t(s_.batch * s_.out_channels * out_area_) * element_ <= kWholeBiasFillBytes;
    if (whole) {
      kernels::cpu::fill_channel_bias(dtype_, s_.batch, s_.out_channels, out_area_, bias, y);
    }
    for (int64_t n = 0; n < s_.batch; ++n) {
      const void* cols = columns_of(x, n, columns.get());
      void* image = output_image(y, n, element_);
      if (bias != nullptr && !whole) {
        kernels::cpu::fill_channel_bias(dtype_, 1, s_.out_channels, out_area_, bias, image);
      }
      product(shape, w, cols, bias != nullptr ? 1.0 : 0.0, image);
    }
  }

  // columns = W^T g[n], one GEMM per group; then scattered onto the (zeroed) image.
  void backward_data(const void* grad_y, const void* w, void* grad_x) const {
    if (one_pixel()) {  // grad_x [batch, in] = grad_y [batch, out] W
      product(packed_shape(s_.batch, g_.channels, s_.out_channels, false, false), grad_y, w, 0.0,
              grad_x);
      return;
    }
    kernels::cpu::fill(dtype_, s_.batch * g_.channels * g_.height * g_.width, grad_x, 0.0);
    HostScratch columns(column_bytes(element_));
    kernels::GemmShape shape = packed_shape(patch_, out_area_, group_out_, true, false);
    shape.batch = s_.groups;
    shape.batch_stride_a = group_out_ * patch_;
    shape.batch_stride_b = group_out_ * out_area_;
    shape.batch_stride_c = patch_ * out_area_;
    for (int64_t n = 0; n < s_.batch; ++n) {
      void* image = input_image(grad_x, n, element_);
      void* target = direct_ ? image : columns.get();
      product(shape, w, output_image(grad_y, n, operand_element_), 0.0, target);
      if (!direct_) kernels::cpu::col2im(dtype_, g_, columns.get(), image);
    }
  }

  // dW[g] (+)= g[n][g] columns[g]^T
  void backward_filter(const void* x, const void* grad_y, void* grad_w) const {
    if (s_.batch == 0) {
      kernels::cpu::fill(dtype_, s_.out_channels * patch_, grad_w, 0.0);
      return;
    }
    if (one_pixel()) {  // grad_w [out, in] = grad_y^T [out, batch] x [batch, in]
      product(packed_shape(s_.out_channels, g_.channels, s_.batch, true, false), grad_y, x, 0.0,
              grad_w);
      return;
    }
    HostScratch columns(column_bytes(operand_element_));
    kernels::GemmShape shape = packed_shape(group_out_, patch_, out_area_, false, true);
    shape.batch = s_.groups;
    shape.batch_stride_a = group_out_ * out_area_;
    shape.batch_stride_b = patch_ * out_area_;
    shape.batch_stride_c = group_out_ * patch_;
    for (int64_t n = 0; n < s_.batch; ++n) {
      const void* cols = columns_of(x, n, columns.get());
      product(shape, output_image(grad_y, n, operand_element_), cols, n == 0 ? 0.0 : 1.0, grad_w);
    }
  }

 private:
  // C (dtype_) = op(A) op(B) + beta C, with A and B of operand_.
  void product(const kernels::GemmShape& shape, const void* a, const void* b, double beta,
               void* c) const {
    if (operand_ == dtype_) return kernels::cpu::gemm(dtype_, shape, 1.0, a, b, beta, c);
    kernels::cpu::gemm_mixed(operand_, shape, 1.0, a, b, beta, static_cast<float*>(c));
  }
  // A 1x1 convolution of one output pixel (1x1 images: squeeze-and-excitation blocks, the last
  // stage of a network fed small images) is a fully connected layer on [batch, channels]: one
  // product over the batch reads the weight once, where a product per image is a
  // matrix-vector product that reads all of it for each image.
  bool one_pixel() const { return direct_ && out_area_ == 1 && s_.groups == 1; }
  // C [m, n] = op(A) op(B), both row-major and packed: A [m, k] ([k, m] transposed), B [k, n]
  // ([n, k] transposed).
  static kernels::GemmShape packed_shape(int64_t m, int64_t n, int64_t k, bool transpose_a,
                                         bool transpose_b) {
    kernels::GemmShape shape;
    shape.transpose_a = transpose_a;
    shape.transpose_b = transpose_b;
    shape.m = m;
    shape.n = n;
    shape.k = k;
    shape.lda = transpose_a ? m : k;
    shape.ldb = transpose_b ? k : n;
    shape.ldc = n;
    return shape;
  }
  size_t column_bytes(size_t element) const {
    return direct_ ? 0 : size_t(g_.channels * g_.kernel_h * g_.kernel_w * out_area_) * element;
  }
  void* input_image(const void* base, int64_t n, size_t element) const {
    return const_cast<char*>(static_cast<const char*>(base)) +
           size_t(n * g_.channels * g_.height * g_.width) * element;
  }
  void* output_image(const void* base, int64_t n, size_t element) const {
    return const_cast<char*>(static_cast<const char*>(base)) +
           size_t(n * s_.out_channels * out_area_) * element;
  }
  // The column matrix of image n: the image itself (direct) or `columns`, filled by im2col.
  const void* columns_of(const void* x, int64_t n, void* columns) const {
    const void* image = input_image(x, n, operand_element_);
    if (direct_) return image;
    kernels::cpu::im2col(operand_, g_, image, columns);
    return columns;
  }

  DType dtype_, operand_;
  const Conv2dShape& s_;
  const kernels::Conv2dGeometry& g_;
  size_t element_, operand_element_;
  int64_t group_in_ = 0, group_out_ = 0, patch_ = 0, out_area_ = 0;
  bool direct_ = false;
};

using kernels::cpu::ConvPass;

using kernels::cpu::ConvPath;

// A convolution pass on oneDNN or the direct kernels when the rule (or MPIGRAD_CPU_CONV) picks
// one of them and it can run the case: returns the path that ran, or Gemm, with nothing written,
// which sends it to CpuConv (kernels/conv.h). The forward's `bias` goes to either path; grad_bias
// to oneDNN and the small-channel filter gradient, and *wrote_grad_bias says whether one of them
// wrote it; null: none.
ConvPath other_conv_path(ConvPass pass, DType operand, DType out, const Conv2dShape& shape,
                         const void* first, const void* second, void* result,
                         const void* bias = nullptr, void* grad_bias = nullptr,
                         bool* wrote_grad_bias = nullptr) {
  bool wrote = false;
  ConvPath ran = ConvPath::Gemm;
  switch (kernels::cpu::conv2d_path(pass, operand, shape)) {
    case ConvPath::OneDnn:
      if (kernels::cpu::conv2d_onednn(pass, operand, out, shape, first, second, result, bias,
                                      grad_bias)) {
        ran = ConvPath::OneDnn;
        wrote = grad_bias != nullptr;
      }
      break;
    case ConvPath::Direct:
      if (operand == out) {
        wrote = kernels::cpu::direct_conv2d(pass, operand, shape, first, second, result, bias,
                                            grad_bias);
        ran = ConvPath::Direct;
      }
      break;
    default:
      break;
  }
  if (wrote_grad_bias != nullptr) *wrote_grad_bias = wrote;
  return ran;
}

// The FLOPs the profiler's kernel spans carry (core/profiler.h).
double gemm_shape_flops(const GemmShape& s) {
  return gemm_flops(s.batch, s.m, s.n, s.k);
}
double conv_shape_flops(const Conv2dShape& s) {
  const auto& g = s.geometry;
  return conv2d_flops(s.batch, s.out_channels, g.out_h, g.out_w, g.channels / s.groups, g.kernel_h,
                      g.kernel_w);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() { initialize_cpu_runtime(); }

  Allocator& allocator() override { return host_allocator(); }
  void copy_from_host(void* dst, const void* src, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, size_t(nbytes));
  }
  void copy_to_host(void* dst, const void* src, int64_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, size_t(nbytes));
  }

  void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in) override {
    kernels::cpu::unary(op, dtype, loop, out, in);
  }
  void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                      const void* grad_out, const void* in, const void* out) override {
    kernels::cpu::unary_backward(op, dtype, loop, grad_in, grad_out, in, out);
  }
  void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
              const void* b) override {
    kernels::cpu::binary(op, dtype, loop, out, a, b);
  }
  void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
             const void* b) override {
    kernels::cpu::where(dtype, loop, out, cond, a, b);
  }
  void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo,
             double hi) override {
    kernels::cpu::clamp(dtype, loop, out, in, lo, hi);
  }
  void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
            const void* in) override {
    kernels::cpu::copy(out_dtype, in_dtype, loop, out, in);
  }
  void fill(DType dtype, int64_t n, void* out, double value) override {
    kernels::cpu::fill(dtype, n, out, value);
  }
  bool supports_slice_backward() const override { return true; }
  void slice_backward(DType dtype, const kernels::SliceWindow& window, void* out,
                      const void* grad) override {
    kernels::cpu::slice_backward(element_size(dtype), window, out, grad);
  }
  void arange(DType dtype, int64_t n, void* out, double start, double step) override {
    kernels::cpu::arange(dtype, n, out, start, step);
  }
  void reduce(ReduceOp op, DType dtype, int64_t outer, int64_t extent, int64_t inner, void* out,
              int64_t* indices, const void* in) override {
    kernels::cpu::reduce(op, dtype, outer, extent, inner, out, indices, in);
  }
  void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
            double beta, void* c) override {
    ProfileSpan span("gemm", ProfileKind::Kernel, [&] { return gemm_shape_flops(shape); });
    kernels::cpu::gemm(dtype, shape, alpha, a, b, beta, c);
  }
  void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                  double beta, float* c) override {
    ProfileSpan span("gemm_mixed", ProfileKind::Kernel, [&] { return gemm_shape_flops(shape); });
    kernels::cpu::gemm_mixed(operand, shape, alpha, a, b, beta, c);
  }
  std::string mixed_precision_kernels(DType operand) override {
    if (operand == DType::Float16) {
      return "fp32 conversion + sgemm: these CPUs have no fp16 dot product";
    }
    return kernels::cpu::bf16_gemm_path();
  }
  void softmax_forward(bool log, DType dtype, int64_t rows, int64_t cols, void* out, const void* in,
                       const kernels::SoftmaxScaleMask& input) override {
    kernels::cpu::softmax_forward(log, dtype, rows, cols, out, in, input);
  }
  void softmax_backward(bool log, DType dtype, int64_t rows, int64_t cols, void* grad_in,
                        const void* grad_out, const void* out, double scale) override {
    kernels::cpu::softmax_backward(log, dtype, rows, cols, grad_in, grad_out, out, scale);
  }
  int64_t index_select(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                       const int64_t* index, int64_t count, void* out, const void* in) override {
    return kernels::cpu::index_select(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t index_add(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                    int64_t count, void* out, const void* in) override {
    return kernels::cpu::index_add(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t gather(DType dtype, int64_t outer, int64_t extent, int64_t inner, const int64_t* index,
                 int64_t count, void* out, const void* in) override {
    return kernels::cpu::gather(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t scatter_add(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, void* out, const void* in) override {
    return kernels::cpu::scatter_add(dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t scatter_reduce(ScatterReduceOp op, DType dtype, int64_t outer, int64_t extent,
                         int64_t inner, const int64_t* index, int64_t count, void* out,
                         const void* in) override {
    return kernels::cpu::scatter_reduce(op, dtype, outer, extent, inner, index, count, out, in);
  }
  int64_t gather_mul_scatter(DType dtype, const kernels::GatherMulScatterArgs& args) override {
    return kernels::cpu::gather_mul_scatter(dtype, args);
  }
  void scatter_winner(DType dtype, int64_t outer, int64_t extent, int64_t inner,
                      const int64_t* index, int64_t count, const void* out, const void* base,
                      const void* in, int64_t* winner) override {
    kernels::cpu::scatter_winner(dtype, outer, extent, inner, index, count, out, base, in, winner);
  }
  int64_t radius_graph_count(const kernels::RadiusGraphArgs& args, int64_t* counts) override {
    return kernels::cpu::radius_graph_count(args, counts);
  }
  void radius_graph_write(const kernels::RadiusGraphArgs& args,
                          const kernels::RadiusGraphOutput& out) override {
    kernels::cpu::radius_graph_write(args, out);
  }
  void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
               double hi) override {
    kernels::cpu::uniform(dtype, n, out, seed, offset, lo, hi);
  }
  void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
              double std) override {
    kernels::cpu::normal(dtype, n, out, seed, offset, mean, std);
  }
  void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset,
                 double p) override {
    kernels::cpu::bernoulli(dtype, n, out, seed, offset, p);
  }
  void cross_entropy(DType dtype, int64_t rows, int64_t cols, const void* logits,
                     const int64_t* targets, int64_t ignore_index, double grad_scale, void* losses,
                     void* grad, const TargetCheck& check) override {
    const int64_t bad = kernels::cpu::cross_entropy(dtype, rows, cols, logits, targets,
                                                    ignore_index, grad_scale, losses, grad);
    if (bad >= 0) throw Error(bad_target_message(check, bad, targets[bad], cols));
  }

  void conv2d_forward(DType dtype, const Conv2dShape& shape, const void* x, const void* w,
                      void* y) override {
    conv2d_forward_bias(dtype, shape, x, w, nullptr, y);
  }
  void conv2d_forward_bias(DType dtype, const Conv2dShape& shape, const void* x, const void* w,
                           const void* bias, void* y) override {
    ProfileSpan span("conv2d_forward", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    if (other_conv_path(ConvPass::Forward, dtype, dtype, shape, x, w, y, bias) == ConvPath::Gemm) {
      CpuConv(dtype, shape).forward(x, w, bias, y);
    }
  }
  void conv2d_backward_data(DType dtype, const Conv2dShape& shape, const void* grad_y,
                            const void* w, void* grad_x) override {
    ProfileSpan span("conv2d_backward_data", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    if (other_conv_path(ConvPass::BackwardData, dtype, dtype, shape, grad_y, w, grad_x) ==
        ConvPath::Gemm) {
      CpuConv(dtype, shape).backward_data(grad_y, w, grad_x);
    }
  }
  void conv2d_backward_filter(DType dtype, const Conv2dShape& shape, const void* x,
                              const void* grad_y, void* grad_w) override {
    conv2d_backward_filter_bias(dtype, shape, x, grad_y, grad_w, nullptr);
  }
  bool conv2d_backward_filter_bias(DType dtype, const Conv2dShape& shape, const void* x,
                                   const void* grad_y, void* grad_w, void* grad_bias) override {
    ProfileSpan span("conv2d_backward_filter", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    bool wrote_grad_bias = false;
    const ConvPath path = other_conv_path(ConvPass::BackwardFilter, dtype, dtype, shape, x, grad_y,
                                          grad_w, nullptr, grad_bias, &wrote_grad_bias);
    if (path == ConvPath::Gemm) CpuConv(dtype, shape).backward_filter(x, grad_y, grad_w);
    return wrote_grad_bias;
  }
  void conv2d_forward_mixed(DType operand, const Conv2dShape& shape, const void* x, const void* w,
                            float* y) override {
    conv2d_forward_mixed_bias(operand, shape, x, w, nullptr, y);
  }
  void conv2d_forward_mixed_bias(DType operand, const Conv2dShape& shape, const void* x,
                                 const void* w, const float* bias, float* y) override {
    ProfileSpan span("conv2d_forward_mixed", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    if (other_conv_path(ConvPass::Forward, operand, DType::Float32, shape, x, w, y, bias) ==
        ConvPath::Gemm) {
      CpuConv(DType::Float32, operand, shape).forward(x, w, bias, y);
    }
  }
  void conv2d_backward_data_mixed(DType operand, const Conv2dShape& shape, const void* grad_y,
                                  const void* w, float* grad_x) override {
    ProfileSpan span("conv2d_backward_data_mixed", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    if (other_conv_path(ConvPass::BackwardData, operand, DType::Float32, shape, grad_y, w,
                        grad_x) == ConvPath::Gemm) {
      CpuConv(DType::Float32, operand, shape).backward_data(grad_y, w, grad_x);
    }
  }
  void conv2d_backward_filter_mixed(DType operand, const Conv2dShape& shape, const void* x,
                                    const void* grad_y, float* grad_w) override {
    ProfileSpan span("conv2d_backward_filter_mixed", ProfileKind::Kernel,
                     [&] { return conv_shape_flops(shape); });
    if (other_conv_path(ConvPass::BackwardFilter, operand, DType::Float32, shape, x, grad_y,
                        grad_w) == ConvPath::Gemm) {
      CpuConv(DType::Float32, operand, shape).backward_filter(x, grad_y, grad_w);
    }
  }

  MaxPoolIndices max_pool2d_indices(const Pool2dGeometry& g) override {
    return {g.planes * g.out_h * g.out_w, kernels::cpu::max_pool2d_tap_dtype(g)};
  }
  void pool2d_forward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry, const void* x,
                      void* y, void* indices) override {
    switch (mode) {
      case Pool2dMode::Max:
        return kernels::cpu::max_pool2d_forward(dtype, geometry, x, y, indices);
      case Pool2dMode::AvgIncludePad:
      case Pool2dMode::AvgExcludePad:
        return kernels::cpu::avg_pool2d_forward(dtype, geometry, mode == Pool2dMode::AvgIncludePad,
                                                x, y);
      case Pool2dMode::AdaptiveAvg:
        return kernels::cpu::adaptive_avg_pool2d_forward(dtype, geometry, x, y);
    }
  }
  void pool2d_backward(Pool2dMode mode, DType dtype, const Pool2dGeometry& geometry,
                       const void* /*x*/, const void* /*y*/, const void* indices,
                       const void* grad_y, void* grad_x) override {
    switch (mode) {
      case Pool2dMode::Max:
        return kernels::cpu::max_pool2d_backward(dtype, geometry, grad_y, indices, grad_x);
      case Pool2dMode::AvgIncludePad:
      case Pool2dMode::AvgExcludePad:
        return kernels::cpu::avg_pool2d_backward(dtype, geometry, mode == Pool2dMode::AvgIncludePad,
                                                 grad_y, grad_x);
      case Pool2dMode::AdaptiveAvg:
        return kernels::cpu::adaptive_avg_pool2d_backward(dtype, geometry, grad_y, grad_x);
    }
  }

  void batch_norm_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                   double factor, double eps, const void* x, const void* weight,
                                   const void* bias, void* running_mean, void* running_var, void* y,
                                   void* mean, void* invstd) override {
    kernels::cpu::batch_norm_forward_training(dtype, batch, channels, inner, factor, eps, x, weight,
                                              bias, running_mean, running_var, y, mean, invstd);
  }
  void batch_norm_forward_inference(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                    double /*eps*/, const void* x, const void* weight,
                                    const void* bias, const void* mean, const void* /*variance*/,
                                    const void* invstd, void* y) override {
    kernels::cpu::batch_norm_forward(dtype, batch, channels, inner, x, mean, invstd, weight, bias,
                                     y);
  }
  void batch_norm_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                           bool training, double /*eps*/, const void* x, const void* grad_y,
                           const void* mean, const void* invstd, const void* weight, void* grad_x,
                           void* grad_weight, void* grad_bias) override {
    kernels::cpu::batch_norm_backward(dtype, batch, channels, inner, training, x, grad_y, mean,
                                      invstd, weight, grad_x, grad_weight, grad_bias);
  }

  // Float32 only: the fusion is for the CNNs that train in it; Float64 (gradient checks) keeps
  // the composition.
  bool supports_batch_norm_relu(DType dtype) const override { return dtype == DType::Float32; }
  void batch_norm_relu_forward_training(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                        double factor, double eps, const void* x,
                                        const void* weight, const void* bias, void* running_mean,
                                        void* running_var, void* y, void* mean,
                                        void* invstd) override {
    kernels::cpu::batch_norm_relu_forward_training(dtype, batch, channels, inner, factor, eps, x,
                                                   weight, bias, running_mean, running_var, y, mean,
                                                   invstd);
  }
  void batch_norm_relu_backward(DType dtype, int64_t batch, int64_t channels, int64_t inner,
                                const void* x, const void* y, const void* grad_y, const void* mean,
                                const void* invstd, const void* weight, const void* bias,
                                void* grad_x, void* grad_weight, void* grad_bias) override {
    kernels::cpu::batch_norm_relu_backward(dtype, batch, channels, inner, x, y, grad_y, mean,
                                           invstd, weight, bias, grad_x, grad_weight, grad_bias);
  }
  // Float32 with AVX2, as batch_norm_relu: the small CNNs' conv -> BatchNorm -> ReLU -> 2x2 pool.
  bool supports_batch_norm_relu_max_pool(DType dtype, const Pool2dGeometry& pool) const override {
    return kernels::cpu::batch_norm_relu_max_pool_supported(dtype, pool);
  }
  void batch_norm_relu_max_pool_forward_training(DType dtype, const Pool2dGeometry& pool,
                                                 int64_t batch, int64_t channels, double factor,
                                                 double eps, const void* x, const void* weight,
                                                 const void* bias, void* running_mean,
                                                 void* running_var, void* out, void* taps,
                                                 void* mean, void* invstd) override {
    kernels::cpu::batch_norm_relu_max_pool_forward_training(dtype, pool, batch, channels, factor,
                                                            eps, x, weight, bias, running_mean,
                                                            running_var, out, taps, mean, invstd);
  }
  void batch_norm_relu_max_pool_backward(DType dtype, const Pool2dGeometry& pool, int64_t batch,
                                         int64_t channels, const void* x, const void* grad_out,
                                         const void* taps, const void* mean, const void* invstd,
                                         const void* weight, const void* bias, void* grad_x,
                                         void* grad_weight, void* grad_bias) override {
    kernels::cpu::batch_norm_relu_max_pool_backward(dtype, pool, batch, channels, x, grad_out, taps,
                                                    mean, invstd, weight, bias, grad_x, grad_weight,
                                                    grad_bias);
  }

  void layer_norm_forward(DType dtype, int64_t rows, int64_t cols, double eps, const void* x,
                          const void* weight, const void* bias, void* y, void* mean,
                          void* rstd) override {
    kernels::cpu::layer_norm_forward(dtype, rows, cols, eps, x, weight, bias, y, mean, rstd);
  }
  void layer_norm_backward(DType dtype, int64_t rows, int64_t cols, const void* x,
                           const void* grad_y, const void* mean, const void* rstd,
                           const void* weight, void* grad_x, void* grad_weight,
                           void* grad_bias) override {
    kernels::cpu::layer_norm_backward(dtype, rows, cols, x, grad_y, mean, rstd, weight, grad_x,
                                      grad_weight, grad_bias);
  }

  void sgd_step(DType dtype, int64_t count, const SgdSlot* slots) override {
    kernels::cpu::sgd_step_multi(dtype, count, slots);
  }
  void adam_step(DType dtype, int64_t count, const AdamSlot* slots) override {
    kernels::cpu::adam_step_multi(dtype, count, slots);
  }
  bool optimizer_writes_low_copies() const override { return true; }
};

}  // namespace

// ---- The base class's mixed-precision defaults: widen to fp32, then the fp32 kernel ----------

namespace {

// A dense fp32 copy, on the backend's device, of `count` 16-bit elements.
class Widened {
 public:
  Widened(Backend& backend, DType operand, const void* data, int64_t count)
      : backend_(backend), nbytes_(size_t(count) * sizeof(float)) {
    if (count == 0) return;
    ptr_ = backend.allocator().allocate(nbytes_);
    StridedLoop loop;
    loop.ndim = 1;
    loop.size[0] = count;
    loop.stride[0][0] = loop.stride[1][0] = 1;
    backend.copy(DType::Float32, operand, loop, ptr_, data);
  }
  ~Widened() {
    if (ptr_ != nullptr) backend_.allocator().deallocate(ptr_, nbytes_);
  }
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;
  const void* get() const { return ptr_; }

 private:
  Backend& backend_;
  size_t nbytes_;
  void* ptr_ = nullptr;
};

// Elements spanned by a stored matrix of `rows` rows (leading dimension ld, `cols` used) over
// `batch` entries `batch_stride` apart.
int64_t span_of(int64_t batch, int64_t batch_stride, int64_t rows, int64_t cols, int64_t ld) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  return (batch - 1) * batch_stride + (rows - 1) * ld + cols;
}

}  // namespace

void Backend::gemm_mixed(DType operand, const GemmShape& s, double alpha, const void* a,
                         const void* b, double beta, float* c) {
  const Widened a32(*this, operand, a,
                    span_of(s.batch, s.batch_stride_a, s.transpose_a ? s.k : s.m,
                            s.transpose_a ? s.m : s.k, s.lda));
  const Widened b32(*this, operand, b,
                    span_of(s.batch, s.batch_stride_b, s.transpose_b ? s.n : s.k,
                            s.transpose_b ? s.k : s.n, s.ldb));
  gemm(DType::Float32, s, alpha, a32.get(), b32.get(), beta, c);
}

void Backend::batch_norm_relu_forward_training(DType dtype, int64_t, int64_t, int64_t, double,
                                               double, const void*, const void*, const void*, void*,
                                               void*, void*, void*, void*) {
  fail("batch_norm_relu: this backend has no fused batch norm + ReLU for ", dtype_name(dtype),
       " (check supports_batch_norm_relu and compose batch_norm and relu)");
}

void Backend::batch_norm_relu_backward(DType dtype, int64_t, int64_t, int64_t, const void*,
                                       const void*, const void*, const void*, const void*,
                                       const void*, const void*, void*, void*, void*) {
  fail("batch_norm_relu backward: this backend has no fused batch norm + ReLU for ",
       dtype_name(dtype), " (check supports_batch_norm_relu and compose batch_norm and relu)");
}

void Backend::slice_backward(DType dtype, const kernels::SliceWindow&, void*, const void*) {
  fail("slice_backward: this backend has no one-pass slice gradient for ", dtype_name(dtype),
       " (check supports_slice_backward and compose zeros and a copy)");
}

void Backend::batch_norm_relu_max_pool_forward_training(DType dtype, const Pool2dGeometry&, int64_t,
                                                        int64_t, double, double, const void*,
                                                        const void*, const void*, void*, void*,
                                                        void*, void*, void*, void*) {
  fail("batch_norm_relu_max_pool2d: this backend has no fused batch norm + ReLU + max pooling for ",
       dtype_name(dtype),
       " (check supports_batch_norm_relu_max_pool and compose batch_norm_relu and max_pool2d)");
}

void Backend::batch_norm_relu_max_pool_backward(DType dtype, const Pool2dGeometry&, int64_t,
                                                int64_t, const void*, const void*, const void*,
                                                const void*, const void*, const void*, const void*,
                                                void*, void*, void*) {
  fail(
      "batch_norm_relu_max_pool2d backward: this backend has no fused batch norm + ReLU + max "
      "pooling for ",
      dtype_name(dtype),
      " (check supports_batch_norm_relu_max_pool and compose batch_norm_relu and max_pool2d)");
}

std::string Backend::mixed_precision_kernels(DType operand) {
  return std::string("16-bit ") + dtype_name(operand) +
         " operands widened to float32 for this backend's fp32 kernels";
}

void Backend::conv2d_forward_mixed(DType operand, const Conv2dShape& s, const void* x,
                                   const void* w, float* y) {
  const auto& g = s.geometry;
  const Widened x32(*this, operand, x, s.batch * g.channels * g.height * g.width);
  const Widened w32(*this, operand, w,
                    s.out_channels * (g.channels / s.groups) * g.kernel_h * g.kernel_w);
  conv2d_forward(DType::Float32, s, x32.get(), w32.get(), y);
}

void Backend::conv2d_backward_data_mixed(DType operand, const Conv2dShape& s, const void* grad_y,
                                         const void* w, float* grad_x) {
  const auto& g = s.geometry;
  const Widened gy32(*this, operand, grad_y, s.batch * s.out_channels * g.out_h * g.out_w);
  const Widened w32(*this, operand, w,
                    s.out_channels * (g.channels / s.groups) * g.kernel_h * g.kernel_w);
  conv2d_backward_data(DType::Float32, s, gy32.get(), w32.get(), grad_x);
}

void Backend::conv2d_backward_filter_mixed(DType operand, const Conv2dShape& s, const void* x,
                                           const void* grad_y, float* grad_w) {
  const auto& g = s.geometry;
  const Widened x32(*this, operand, x, s.batch * g.channels * g.height * g.width);
  const Widened gy32(*this, operand, grad_y, s.batch * s.out_channels * g.out_h * g.out_w);
  conv2d_backward_filter(DType::Float32, s, x32.get(), gy32.get(), grad_w);
}

namespace {
// y[n, o, :] += bias[o] over y [batch, out_channels, out_h * out_w], with `binary`: the unfused
// bias of the conv2d_*_bias defaults.
void add_conv_bias(Backend& backend, DType dtype, const Conv2dShape& s, const void* bias, void* y) {
  const int64_t area = s.geometry.out_h * s.geometry.out_w;
  StridedLoop loop;
  loop.ndim = 3;
  loop.size[0] = s.batch;
  loop.size[1] = s.out_channels;
  loop.size[2] = area;
  for (int op = 0; op < 2; ++op) {  // y, written and read
    loop.stride[op][0] = s.out_channels * area;
    loop.stride[op][1] = area;
    loop.stride[op][2] = 1;
  }
  loop.stride[2][1] = 1;  // the bias steps with the channel only
  if (loop.numel() > 0) backend.binary(BinaryOp::Add, dtype, loop, y, y, bias);
}
}  // namespace

void Backend::conv2d_forward_bias(DType dtype, const Conv2dShape& s, const void* x, const void* w,
                                  const void* bias, void* y) {
  conv2d_forward(dtype, s, x, w, y);
  if (bias != nullptr) add_conv_bias(*this, dtype, s, bias, y);
}

void Backend::conv2d_forward_mixed_bias(DType operand, const Conv2dShape& s, const void* x,
                                        const void* w, const float* bias, float* y) {
  conv2d_forward_mixed(operand, s, x, w, y);
  if (bias != nullptr) add_conv_bias(*this, DType::Float32, s, bias, y);
}

bool Backend::conv2d_backward_filter_bias(DType dtype, const Conv2dShape& s, const void* x,
                                          const void* grad_y, void* grad_w, void*) {
  conv2d_backward_filter(dtype, s, x, grad_y, grad_w);
  return false;
}

std::string bad_target_message(const TargetCheck& check, int64_t position, int64_t value,
                               int64_t classes) {
  return detail::concat(check.op, ": label ", value, " at position ", position,
                        check.targets.empty() ? "" : " of ", check.targets,
                        " is out of range for num_classes = ", classes);
}

namespace detail {
// core/cuda/: the CUDA backend of a visible device, or the error saying why there is none (the
// no-CUDA build's version reports that CUDA support was not built).
Backend& cuda_backend_for(Device device);
}  // namespace detail

Backend& backend_for(Device device) {
  if (device.is_cpu()) {
    static CpuBackend cpu;
    return cpu;
  }
  return detail::cuda_backend_for(device);
}

}  // namespace mpigrad::core
