// The C API's CUDA stream calls on a GPU (mpigrad_train_step_on_stream, mpigrad_predict_on_stream):
// device arrays written by work still queued on the caller's stream are read after it, and the
// losses, weights and predictions are those of the same steps made from host arrays; also with
// [train] cuda_graphs, whose replays keep that order.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/stream.h"
#include "mpigrad/mpigrad_c.h"
#include "nn_cuda_test.h"

namespace {

namespace core = mpigrad::core;
using core::Tensor;

const core::Device kGpu = core::cuda(0);
constexpr int64_t kBatch = 8, kIn = 32, kOut = 4;

std::string config(bool graphs) {
  return std::string(
             "[model]\nname = mlp\ninput_shape = 32\nhidden = 64\noutputs = 4\n[loss]\nname = "
             "mse\n[optim]\nname = sgd\nlr = 0.05\n[train]\nseed = 5\ncuda_graph_warmup = 1\n"
             "cuda_graphs = ") +
         (graphs ? "true\n" : "false\n");
}

mpigrad_model create(const std::string& text, const char* device) {
  mpigrad_model model{};
  REQUIRE_MESSAGE(mpigrad_model_create(&model, text.c_str(), device) == MPIGRAD_SUCCESS,
                  mpigrad_last_error());
  return model;
}

mpigrad_array device_array(const Tensor& t) {
  const int64_t shape[2] = {t.size(0), t.size(1)};
  mpigrad_array array = mpigrad_host_array(t.data_ptr(), 2, shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
  array.memory = MPIGRAD_MEMORY_CUDA;
  array.device = 0;
  return array;
}

std::vector<float> values(int64_t step, int64_t count, double scale) {
  std::vector<float> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(scale * std::sin(0.37 * double(i) + double(step)));
  return v;
}

}  // namespace

MPIGRAD_NN_CUDA_TEST_CASE(
    "steps and predictions on the caller's stream equal the host-array ones") {
  for (const bool graphs : {false, true}) {
    CAPTURE(graphs);
    mpigrad_model reference = create(config(false), "cpu");
    mpigrad_model model = create(config(graphs), "cuda:0");
    core::Stream stream(kGpu);
    Tensor x = core::zeros({kBatch, kIn}, core::TensorOptions().device(kGpu));
    Tensor y = core::zeros({kBatch, kOut}, core::TensorOptions().device(kGpu));
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<float> hx = values(step, kBatch * kIn, 1.0),
                         hy = values(step, kBatch * kOut, 0.5);
      const int64_t xs[2] = {kBatch, kIn}, ys[2] = {kBatch, kOut};
      mpigrad_array host_x = mpigrad_host_array(hx.data(), 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
      mpigrad_array host_y = mpigrad_host_array(hy.data(), 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
      double expected = 0;
      REQUIRE(mpigrad_train_step(reference, &host_x, &host_y, &expected) == MPIGRAD_SUCCESS);
      {
        // The host's simulation writes the fields on its stream; nobody waits for it.
        core::StreamGuard on(stream);
        x.copy_(Tensor::from_vector<float>(hx, {kBatch, kIn}).to(kGpu));
        y.copy_(Tensor::from_vector<float>(hy, {kBatch, kOut}).to(kGpu));
      }
      mpigrad_array dx = device_array(x), dy = device_array(y);
      REQUIRE_MESSAGE(mpigrad_train_step_on_stream(model, &dx, &dy, nullptr, stream.handle()) ==
                          MPIGRAD_SUCCESS,
                      mpigrad_last_error());
      double loss = 0;
      REQUIRE(mpigrad_last_loss(model, &loss) == MPIGRAD_SUCCESS);
      CHECK(loss == doctest::Approx(expected).epsilon(1e-5));
    }
    Tensor out = core::zeros({kBatch, kOut}, core::TensorOptions().device(kGpu));
    mpigrad_array dx = device_array(x), dout = device_array(out);
    REQUIRE(mpigrad_predict_on_stream(model, &dx, &dout, stream.handle()) == MPIGRAD_SUCCESS);
    std::vector<float> hx = values(5, kBatch * kIn, 1.0), expected(size_t(kBatch * kOut));
    const int64_t xs[2] = {kBatch, kIn}, ys[2] = {kBatch, kOut};
    mpigrad_array host_x = mpigrad_host_array(hx.data(), 2, xs, MPIGRAD_F32, MPIGRAD_ORDER_C);
    mpigrad_array host_out =
        mpigrad_host_array(expected.data(), 2, ys, MPIGRAD_F32, MPIGRAD_ORDER_C);
    REQUIRE(mpigrad_predict(reference, &host_x, &host_out) == MPIGRAD_SUCCESS);
    stream.synchronize();
    const std::vector<float> got = out.to(core::kCPU).to_vector<float>();
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-4));
    mpigrad_model_destroy(&model);
    mpigrad_model_destroy(&reference);
  }
}
