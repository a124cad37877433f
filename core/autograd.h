// Autograd: graph nodes, saved tensors, the grad-mode switch, and the backward engine.
//
// Each differentiable op records one Node whose single output is the op's result. A Node keeps
// only what its backward needs (SavedTensor checks that nobody modified it in place since) and an
// edge per input that requires grad. Leaves end in an AccumulateGrad node, which adds into .grad
// and then fires the leaf's grad-ready hooks.
//
// The engine is iterative: it counts, for every reachable node, how many gradients it still
// waits for, and runs a node the moment that count reaches zero, highest sequence number first
// (reverse creation order). AccumulateGrad nodes run first of all once ready, so a leaf's hook
// fires as soon as its gradient is final while the rest of backward goes on: the DDP layer starts
// all-reducing that bucket then. Graphs deeper than the stack are fine.
//
// Early gradients: a node that computes several gradients may hand one over before computing
// the rest (release_gradient_early). Where that gradient's edge leads only to leaves, within a
// few nodes (an accumulator, or W.t()'s transpose before it), the engine runs that short chain
// at once, so the leaves' hooks fire while the node goes on. matmul and conv2d do this with their
// weight's gradient before computing their input's, which is as large a product: DDP's bucket
// for a layer then starts one GEMM earlier. Values are the same; only the order changes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

// ---- Grad mode ---------------------------------------------------------------------------------
bool grad_enabled();  // per thread
void set_grad_enabled(bool enabled);

// Disables graph recording on this thread for its lifetime (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// ---- Saved tensors -----------------------------------------------------------------------------
// A tensor kept for backward together with the storage version it had when saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  // Keeps a detached alias (same storage, no history); `is_output` documents that a node saves
  // its own result.
  SavedTensor(const Tensor& tensor, bool is_output = false);  // NOLINT
  // The tensor, or core::Error if it was modified in place or already released.
  const Tensor& get(const Node& owner) const;
  void release() {
    tensor_ = Tensor();
    released_ = true;
  }
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint32_t version_ = 0;
  bool released_ = false;
};

// ---- Nodes -------------------------------------------------------------------------------------
class Node {
 public:
  Node();
  virtual ~Node();  // iterative: releasing a long chain does not recurse
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual const char* name() const = 0;
  // Given the gradient of this node's output, writes one gradient per entry of `next` into
  // grad_inputs (already sized; leave an entry undefined when that input gets none).
  virtual void apply(const Tensor& grad_output, std::vector<Tensor>& grad_inputs) = 0;
  // Drops saved tensors after a backward without retain_graph.
  virtual void release_saved() {}

  // One entry per differentiable input of the op; null where that input does not require grad.
  std::vector<std::shared_ptr<Node>> next;
  uint64_t sequence_nr;

  // Engine bookkeeping for the backward in progress.
  uint64_t graph_task = 0;
  int pending = 0;
  Tensor grad_sum;
};

// Adds the incoming gradient into a leaf's .grad, then fires the leaf's grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  const char* name() const override { return "AccumulateGrad"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grad_inputs) override;

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;           // for results of ops
  std::shared_ptr<Node> grad_accumulator;  // for leaves, created on first use
  Tensor grad;
  std::vector<std::pair<int, GradReadyHook>> hooks;
  int next_hook_id = 0;
};

// ---- Recording ---------------------------------------------------------------------------------
// True when grad mode is on and any input requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The edge through which gradient flows into `input`: its grad_fn, or its leaf's accumulator,
// or null when it does not require grad.
std::shared_ptr<Node> gradient_edge(const Tensor& input);

// Makes `node` the grad_fn of `result` with one edge per input, and marks result requires_grad.
void set_history(const Tensor& result, std::shared_ptr<Node> node,
                 std::initializer_list<const Tensor*> inputs);
void set_history(const Tensor& result, std::shared_ptr<Node> node,
                 const std::vector<Tensor>& inputs);

// Refuses an in-place write into `tensor` that autograd cannot allow (a leaf requiring grad while
// grad mode is on); `op` names the op in the error.
void check_inplace(const Tensor& tensor, const char* op);

// Inside node.apply, once grads[index] is final: hands it over to that input's edge now instead
// of when apply returns, and leaves grads[index] undefined. If that completes a node whose edges
// lead only to leaves within a few steps, that chain runs before this call returns (see "Early
// gradients" above); otherwise the gradient waits its turn as usual. Where the engine is not
// running `node` (a test calling apply directly) it does nothing: grads[index] stays. Throws for
// an index already handed over.
void release_gradient_early(const Node& node, std::vector<Tensor>& grads, size_t index);

// ---- Backward ----------------------------------------------------------------------------------
// Runs backward from `root` with `gradient` (ones for a one-element root if undefined).
void backward(const Tensor& root, const Tensor& gradient = Tensor(), bool retain_graph = false);

// Queues `callback` to run once the backward in progress on this thread has processed its last
// node, before backward() returns (PyTorch's queue_callback). Only valid inside a backward, e.g.
// from a grad-ready hook: DDP uses it to finish its last buckets. Throws outside a backward.
void queue_backward_callback(std::function<void()> callback);

// torch's zero_grad over `leaves` (a module's or an optimizer's parameters): each gradient that
// is defined becomes undefined (set_to_none) or is filled with zeros in place, which keeps a
// gradient that is a view (DDP's bucket views) pointing where it did.
void zero_grad(const std::vector<Tensor>& leaves, bool set_to_none);

}  // namespace mpigrad::core
