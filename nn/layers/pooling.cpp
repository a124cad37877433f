#include "mpigrad/nn/layers/pooling.h"

#include <sstream>
#include <string>

namespace mpigrad::nn {

namespace {
functional::Pool2dOptions square(int64_t kernel, int64_t stride, int64_t padding) {
  functional::Pool2dOptions o;
  o.kernel_size = {kernel, kernel};
  o.stride = {stride, stride};
  o.padding = {padding, padding};
  return o;
}
// torch prints an int when both entries agree.
std::string entry(const std::array<int64_t, 2>& v) {
  std::ostringstream out;
  if (v[0] == v[1]) {
    out << v[0];
  } else {
    out << "(" << v[0] << ", " << v[1] << ")";
  }
  return out.str();
}
std::array<int64_t, 2> effective_stride(const functional::Pool2dOptions& o) {
  return {o.stride[0] == 0 ? o.kernel_size[0] : o.stride[0],
          o.stride[1] == 0 ? o.kernel_size[1] : o.stride[1]};
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation)
    : options_(square(kernel_size, stride, padding)) {
  options_.dilation = {dilation, dilation};
}

Tensor MaxPool2d::forward(const Tensor& input) {
  return functional::max_pool2d(input, options_);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + entry(options_.kernel_size) +
         ", stride=" + entry(effective_stride(options_)) + ", padding=" + entry(options_.padding) +
         ", dilation=" + entry(options_.dilation) + ", ceil_mode=False";
}

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding, bool count_include_pad)
    : options_(square(kernel_size, stride, padding)) {
  options_.count_include_pad = count_include_pad;
}

Tensor AvgPool2d::forward(const Tensor& input) {
  return functional::avg_pool2d(input, options_);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + entry(options_.kernel_size) +
         ", stride=" + entry(effective_stride(options_)) + ", padding=" + entry(options_.padding);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  return functional::adaptive_avg_pool2d(input, output_size_);
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + entry(output_size_);
}

}  // namespace mpigrad::nn
