// ONNX's sequence ops, as far as exporters write them around tensors: PyTorch's dynamo
// exporter turns `x.split(...)` and `x.chunk(...)` into SplitToSequence followed by SequenceAt,
// and lists of tensors into SequenceConstruct / ConcatFromSequence. A sequence lives beside the
// graph's tensors (one std::vector<Tensor> per value) for the length of one forward; its
// elements keep their autograd history.
#include <algorithm>
#include <numeric>

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn::onnx_ops {

namespace {

using core::Tensor;

const std::vector<Tensor>& sequence_of(int id, const std::vector<std::vector<Tensor>>& sequences,
                                       const std::vector<bool>& defined, const std::string& where) {
  MPIGRAD_CHECK(id >= 0 && size_t(id) < sequences.size() && defined[size_t(id)], where,
                ": its input is not a sequence");
  return sequences[size_t(id)];
}

const Tensor& tensor_of(int id, const std::vector<Tensor>& values, const std::string& where) {
  MPIGRAD_CHECK(id >= 0 && values[size_t(id)].defined(), where, ": a tensor input is missing");
  return values[size_t(id)];
}

int64_t position(const Tensor& index, int64_t length, const std::string& where) {
  int64_t p = host_ints(index).at(0);
  if (p < 0) p += length;
  MPIGRAD_CHECK(p >= 0 && p < length, where, ": position out of range for a sequence of ", length);
  return p;
}

SequenceFunction split_to_sequence(const NodeView& node) {
  const std::string where = node.where();
  const int64_t axis = node.get_int("axis", 0);
  const bool keepdims = node.get_int("keepdims", 1) != 0;
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    const Tensor& x = tensor_of(in.at(0), state.values, where);
    const int64_t a = wrap_axis(axis, x.dim(), where);
    const int64_t length = x.shape()[int(a)];
    std::vector<int64_t> sizes;
    if (in.size() > 1 && in[1] >= 0) {
      const Tensor& split = tensor_of(in[1], state.values, where);
      sizes = host_ints(split);
      if (split.dim() == 0) {  // one chunk size, the last chunk smaller
        const int64_t chunk = sizes.at(0);
        MPIGRAD_CHECK(chunk > 0, where, ": split size must be positive");
        sizes.clear();
        for (int64_t left = length; left > 0; left -= chunk) sizes.push_back(std::min(chunk, left));
      }
    } else {
      sizes.assign(size_t(length), 1);
    }
    MPIGRAD_CHECK(std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) == length, where,
                  ": split sizes do not add up to ", length);
    std::vector<Tensor> pieces;
    int64_t start = 0;
    for (int64_t size : sizes) {
      Tensor piece = x.narrow(a, start, size);
      if (!keepdims && !(in.size() > 1 && in[1] >= 0)) piece = piece.squeeze(a);
      pieces.push_back(piece);
      start += size;
    }
    state.set(out.at(0), std::move(pieces));
  };
}

SequenceFunction sequence_at(const NodeView& node) {
  const std::string where = node.where();
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    const auto& sequence = sequence_of(in.at(0), state.sequences, state.is_sequence, where);
    const Tensor& index = tensor_of(in.at(1), state.values, where);
    state.set_tensor(out.at(0), sequence[size_t(position(index, int64_t(sequence.size()), where))]);
  };
}

SequenceFunction sequence_length(const NodeView& node) {
  const std::string where = node.where();
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    const auto& sequence = sequence_of(in.at(0), state.sequences, state.is_sequence, where);
    state.set_tensor(out.at(0), Tensor::from_vector(std::vector<int64_t>{int64_t(sequence.size())},
                                                    core::Shape{}));
  };
}

SequenceFunction sequence_construct(const NodeView& node) {
  const std::string where = node.where();
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    std::vector<Tensor> items;
    for (int id : in) items.push_back(tensor_of(id, state.values, where));
    state.set(out.at(0), std::move(items));
  };
}

SequenceFunction sequence_empty(const NodeView&) {
  return [](const std::vector<int>&, const std::vector<int>& out, SequenceState& state) {
    state.set(out.at(0), {});
  };
}

SequenceFunction sequence_insert(const NodeView& node) {
  const std::string where = node.where();
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    std::vector<Tensor> items = sequence_of(in.at(0), state.sequences, state.is_sequence, where);
    const Tensor& item = tensor_of(in.at(1), state.values, where);
    int64_t p = int64_t(items.size());
    if (in.size() > 2 && in[2] >= 0) {
      p = host_ints(tensor_of(in[2], state.values, where)).at(0);
      if (p < 0) p += int64_t(items.size());
      MPIGRAD_CHECK(p >= 0 && p <= int64_t(items.size()), where, ": position out of range");
    }
    items.insert(items.begin() + p, item);
    state.set(out.at(0), std::move(items));
  };
}

SequenceFunction concat_from_sequence(const NodeView& node) {
  const std::string where = node.where();
  const int64_t axis = node.get_int("axis", 0);
  const bool new_axis = node.get_int("new_axis", 0) != 0;
  return [=](const std::vector<int>& in, const std::vector<int>& out, SequenceState& state) {
    const auto& sequence = sequence_of(in.at(0), state.sequences, state.is_sequence, where);
    MPIGRAD_CHECK(!sequence.empty(), where, ": cannot concatenate an empty sequence");
    const int64_t rank = sequence[0].dim() + (new_axis ? 1 : 0);
    const int64_t a = wrap_axis(axis, rank, where);
    state.set_tensor(out.at(0), new_axis ? core::stack(sequence, a) : core::cat(sequence, a));
  };
}

}  // namespace

void add_sequence_ops(OpTable& t) {
  // A sequence lives only for one forward, so no sequence op runs at load.
  t.add("SplitToSequence", split_to_sequence).inputs(1, 2).not_foldable();
  t.add("SequenceAt", sequence_at).inputs(2, 2).not_foldable();
  t.add("SequenceLength", sequence_length).not_foldable();
  t.add("SequenceConstruct", sequence_construct).inputs(1, kVariadic).not_foldable();
  t.add("SequenceEmpty", sequence_empty).inputs(0, 0).not_foldable();
  t.add("SequenceInsert", sequence_insert).inputs(2, 3).not_foldable();
  t.add("ConcatFromSequence", concat_from_sequence).not_foldable();
}

}  // namespace mpigrad::nn::onnx_ops
