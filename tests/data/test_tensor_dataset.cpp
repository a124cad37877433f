// TensorDataset: fields from the tensors' dtypes and per-sample shapes, batches by index, and one
// error naming the field for tensors that cannot be a dataset.
#include <doctest/doctest.h>

#include <vector>

#include "../error_message.h"
#include "mpigrad/data/tensor_dataset.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::error_message;

TEST_CASE("TensorDataset: fields, size and batches of any field names and dtypes") {
  const Tensor images =
      Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 2, 2});
  const Tensor labels = Tensor::from_vector<int64_t>({7, 8, 9}, {3});
  const data::TensorDataset dataset({{"pixels", images}, {"class", labels}}, "two fields");
  CHECK(dataset.size() == 3);
  CHECK(dataset.describe() == "two fields");
  REQUIRE(dataset.fields().size() == 2);
  CHECK(dataset.fields()[0] == data::FieldInfo{"pixels", core::kFloat32, {2, 2}});
  CHECK(dataset.fields()[1] == data::FieldInfo{"class", core::kInt64, {}});
  const std::vector<int64_t> indices = {2, 0, 2};
  const data::Batch batch = dataset.get_batch(indices);
  CHECK(batch.indices == indices);
  CHECK(batch["class"].to_vector<int64_t>() == std::vector<int64_t>{9, 7, 9});
  CHECK(batch["pixels"].to_vector<float>() ==
        std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(dataset.tensor("class").to_vector<int64_t>() == std::vector<int64_t>{7, 8, 9});
}

TEST_CASE("TensorDataset: bad tensors and indices are one error naming the field") {
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  const Tensor y = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  CHECK(error_message([&] {
          data::TensorDataset({{"x", x}, {"y", y}}, "mine");
        }) == "TensorDataset mine field 'y' has 3 samples, field 'x' 4");
  const Tensor scalar = Tensor::from_vector<float>({1}, {});
  CHECK(error_message([&] {
          data::TensorDataset({{"s", scalar}}, "mine");
        }) == "TensorDataset mine field 's': a tensor [N, ...] is needed, got shape []");
  CHECK(error_message([] { data::TensorDataset({}, "mine"); }) == "TensorDataset mine: no fields");
  const data::TensorDataset dataset({{"x", x}});
  const std::vector<int64_t> outside = {4};
  CHECK(error_message([&] { dataset.get_batch(outside); }).find("in-memory tensors") !=
        std::string::npos);
  CHECK(error_message([&] { dataset.tensor("y"); }) ==
        "TensorDataset in-memory tensors: no field 'y'");
}
