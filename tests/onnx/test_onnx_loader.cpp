// OnnxModel's loading: names, BatchNorm layers and buffers, modes, external data, and one clear
// error for each kind of bad file.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "../error_message.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/nn/onnx/onnx_model.h"
#include "onnx_graph.h"

using namespace mpigrad;
using mpigrad::test::OnnxGraph;

TEST_CASE("OnnxModel: a missing file is one error naming it") {
  CHECK_THROWS_WITH_AS(nn::OnnxModel::load("/nonexistent/model.onnx"),
                       doctest::Contains("/nonexistent/model.onnx"), core::Error);
}
