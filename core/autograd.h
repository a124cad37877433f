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
//
// Derivatives of derivatives: a backward with create_graph runs every node's apply with grad mode
// on, so the ops a node computes its gradients with record a graph of their own, and saved
// tensors come back with the history they had when saved (SavedTensor::get). The gradients are
// then differentiable, to any order (forces as -dE/dx in a loss, a PDE residual, Hessian-vector
// products). A node says whether its apply is written in differentiable ops
// (Node::differentiable_backward); one that is not stops such a backward with an error that names
// it, never with a silent zero. Without create_graph, nodes run their fused first-order kernels
// under no-grad, exactly as before. grad() returns gradients without touching .grad, running only
// the nodes that lead to the tensors asked for.
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
  // Keeps a detached alias (same storage), and the tensor's history weakly: a node may save
  // its own result, whose history is the node itself. `is_output` documents that it does so
  // (save a result after recording its node, so that the history is there to keep).
  SavedTensor(const Tensor& tensor, bool is_output = false);  // NOLINT
  // The tensor, or core::Error if it was modified in place or already released. Under grad mode
  // (a backward with create_graph) it carries its history, so what is computed from it can be
  // differentiated again; otherwise it is the detached alias.
  Tensor get(const Node& owner) const;
  void release() {
    tensor_ = Tensor();
    grad_fn_.reset();
    leaf_.reset();
    released_ = true;
  }
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint32_t version_ = 0;
  bool released_ = false;
  bool requires_grad_ = false;
  std::weak_ptr<Node> grad_fn_;     // the history of a result
  std::weak_ptr<TensorImpl> leaf_;  // a leaf that requires grad
};

// ---- Nodes -------------------------------------------------------------------------------------
class Node : public std::enable_shared_from_this<Node> {
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
  // Whether apply computes its gradients in differentiable ops when grad mode is on (a backward
  // with create_graph), so that they can be differentiated again. False: such a backward stops
  // at this node with an error naming it.
  virtual bool differentiable_backward() const { return false; }

  // One entry per differentiable input of the op; null where that input does not require grad.
  std::vector<std::shared_ptr<Node>> next;
  uint64_t sequence_nr;

  // Engine bookkeeping for the backward in progress.
  uint64_t graph_task = 0;
  int pending = 0;
  bool needed = true;  // grad(): some tensor asked for lies at or below this node
  Tensor grad_sum;
};

// Adds the incoming gradient into a leaf's .grad, then fires the leaf's grad-ready hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf);
  const char* name() const override { return "AccumulateGrad"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grad_inputs) override;
  // Under create_graph, .grad keeps the gradient's history.
  bool differentiable_backward() const override { return true; }
  // False once nobody holds the leaf: nobody can read its gradient then.
  bool leaf_alive() const { return !leaf_.expired(); }

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

// Inside node.apply: whether the gradient of input `index` goes anywhere: its edge is not null
// and, in a grad() call, leads to a tensor asked for. A node may leave the others undefined
// instead of computing what would be dropped: grad(energy, positions) then computes no weight's
// gradient (in backward() every edge that is not null leads somewhere). Where the engine is not
// running `node` (a test calling apply directly), whether the edge is not null.
bool gradient_needed(const Node& node, size_t index);

// A result of an op that has `grad_fn` as its history: an alias of `data` (no copy) that requires
// grad. For nodes that rebuild a saved result, and for tests.
Tensor with_history(const Tensor& data, std::shared_ptr<Node> grad_fn);

// A tensor holding `data` whose gradient flows on unchanged to `edge` (one of a node's input
// edges; null: `data`, detached): for a create_graph backward that computes from its own copy of
// an input (the 16-bit copy autocast kept) while the gradient belongs to the input itself.
// `data` must have that input's shape.
Tensor stand_in(const Tensor& data, std::shared_ptr<Node> edge);

// Whether a gradient a backward node received is the engine's buffer alone (dense, no other
// handle beyond the engine's and the caller's, no view sharing its storage), so the node may keep
// it or write into it instead of a fresh block: AccumulateGrad adopts such a buffer as .grad.
bool is_exclusive_gradient(const Tensor& grad);

// ---- Backward ----------------------------------------------------------------------------------
// Runs backward from `root` with `gradient` (ones for a one-element root if undefined) and adds
// into the .grad of every leaf it reaches. Nodes whose gradients could reach only leaves that
// nobody holds any more run not at all (a force pass's positions, made a leaf inside the step
// function: the training backward computes no gradient of the positions). With create_graph, the
// gradients (and so .grad) carry a graph of their own and can be differentiated again; the graph is
// then kept (retain_graph).
void backward(const Tensor& root, const Tensor& gradient = Tensor(), bool retain_graph = false,
              bool create_graph = false);

struct GradOptions {
  bool retain_graph = false;  // keep the saved tensors for another backward (create_graph does)
  bool create_graph = false;  // the returned gradients are differentiable (see the top)
  bool allow_unused = false;  // an input the outputs do not depend on gets an undefined tensor
};

// The gradients of the sum of `outputs` (each weighted by its grad_outputs entry: ones for a
// one-element output when not given) with respect to each of `inputs`, which must require grad
// (leaves, or results of ops). Runs only the nodes between them, touches no .grad and fires no
// grad-ready hook. An input the outputs do not depend on is an error naming its position, unless
// allow_unused (then its gradient is undefined).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, GradOptions options = {});

// Queues `callback` to run once the backward in progress on this thread has processed its last
// node, before backward() returns (PyTorch's queue_callback). Only valid inside a backward, e.g.
// from a grad-ready hook: DDP uses it to finish its last buckets. Throws outside a backward.
void queue_backward_callback(std::function<void()> callback);

// torch's zero_grad over `leaves` (a module's or an optimizer's parameters): each gradient that
// is defined becomes undefined (set_to_none) or is filled with zeros in place, which keeps a
// gradient that is a view (DDP's bucket views) pointing where it did.
void zero_grad(const std::vector<Tensor>& leaves, bool set_to_none);

}  // namespace mpigrad::core
