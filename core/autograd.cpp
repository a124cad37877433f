#include "mpigrad/core/autograd.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <span>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

// ---- Grad mode -------------------------------------------------------------------------------

namespace {
// Read by every op. initial-exec: a plain %fs-relative load instead of a call to __tls_get_addr
// (the default model of a shared library). The library's TLS block (about 640 bytes) then needs
// static TLS; a dlopen'ed libmpigrad still finds that in glibc's spare static TLS (checked with
// ctypes.CDLL on glibc 2.36, also with glibc.rtld.optional_static_tls=0).
[[gnu::tls_model("initial-exec")]] thread_local bool grad_mode_enabled = true;
std::atomic<uint64_t> next_sequence_nr{0};
std::atomic<uint64_t> next_graph_task{1};
}  // namespace

bool grad_enabled() {
  return grad_mode_enabled;
}
void set_grad_enabled(bool enabled) {
  grad_mode_enabled = enabled;
}

// ---- Saved tensors ---------------------------------------------------------------------------

// Always a detached alias, and the history only weakly: a node then owns other nodes only through
// `next`, which the iterative ~Node can release without recursion, and never owns its own output
// (no cycle). The history of an input is alive anyway (it is the node's edge); that of an output
// is the node, alive while it runs.
SavedTensor::SavedTensor(const Tensor& tensor, bool /*is_output*/)
    : tensor_(tensor.detach()), version_(tensor.version()) {
  if (!tensor.defined() || !tensor.requires_grad()) return;
  requires_grad_ = true;
  if (tensor.grad_fn()) {
    grad_fn_ = tensor.grad_fn();
  } else {
    leaf_ = tensor.impl_shared();
  }
}

Tensor SavedTensor::get(const Node& owner) const {
  MPIGRAD_CHECK(!released_, "Trying to backward through the graph a second time (or to use ",
                owner.name(),
                "'s saved tensors after they were freed): a backward without retain_graph frees "
                "each node's saved tensors as soon as that node has run. Pass retain_graph=true "
                "to the first backward (or grad()) to keep them");
  MPIGRAD_CHECK(tensor_.version() == version_, "a tensor needed by ", owner.name(),
                " for backward was modified by an in-place "
                "operation: it is a ",
                tensor_.dtype(), " tensor of shape ", tensor_.shape(), " now at version ",
                tensor_.version(), ", saved at version ", version_,
                ". Use the out-of-place op, or clone() before modifying it");
  if (!requires_grad_ || !grad_mode_enabled) return tensor_;
  if (std::shared_ptr<TensorImpl> leaf = leaf_.lock()) return Tensor(std::move(leaf));
  if (std::shared_ptr<Node> history = grad_fn_.lock()) return with_history(tensor_, history);
  // A leaf nobody holds any more: nothing can read its gradient, so none flows to it.
  return tensor_;
}

// ---- Nodes -----------------------------------------------------------------------------------

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

namespace {
// The nodes a node's destruction still has to release: a stack that holds its first few on
// the stack frame, so that freeing a small graph (one op's) allocates nothing.
class ReleaseList {
 public:
  void push(std::shared_ptr<Node>&& node) {
    if (inline_count_ < kInline) {
      inline_[inline_count_++] = std::move(node);
    } else {
      more_.push_back(std::move(node));
    }
  }
  // The last one pushed, or null when none is left.
  std::shared_ptr<Node> pop() {
    if (!more_.empty()) {
      std::shared_ptr<Node> node = std::move(more_.back());
      more_.pop_back();
      return node;
    }
    return inline_count_ == 0 ? nullptr : std::move(inline_[--inline_count_]);
  }

 private:
  static constexpr size_t kInline = 8;
  std::shared_ptr<Node> inline_[kInline];
  size_t inline_count_ = 0;
  std::vector<std::shared_ptr<Node>> more_;
};

// While a node is being destroyed, the nodes it releases hand their edges to this work list
// instead of destroying their own successors: freeing a 1M-op chain takes no stack.
[[gnu::tls_model("initial-exec")]] thread_local ReleaseList* nodes_to_release = nullptr;
}  // namespace

Node::~Node() {
  if (nodes_to_release != nullptr) {
    for (auto& edge : next) {
      if (edge) nodes_to_release->push(std::move(edge));
    }
    return;
  }
  ReleaseList work;
  for (auto& edge : next) {
    if (edge) work.push(std::move(edge));
  }
  nodes_to_release = &work;
  // If the popped node's last owner was the list, its ~Node pushes its own edges.
  while (std::shared_ptr<Node> node = work.pop()) node.reset();
  nodes_to_release = nullptr;
}

AccumulateGrad::AccumulateGrad(const std::shared_ptr<TensorImpl>& leaf) : leaf_(leaf) {
  // Runs before any other ready node, so grad-ready hooks fire as early as possible.
  sequence_nr = std::numeric_limits<uint64_t>::max();
}

void AccumulateGrad::apply(const Tensor& grad_output, std::vector<Tensor>&) {
  std::shared_ptr<TensorImpl> leaf_impl = leaf_.lock();
  if (!leaf_impl) return;  // the leaf is gone; nobody can read its gradient
  Tensor leaf(leaf_impl);
  AutogradMeta& meta = leaf.autograd_meta();
  Tensor incoming = grad_output;
  if (incoming.requires_grad()) {
    // create_graph: .grad keeps the gradient's history, summed out of place.
    if (incoming.dtype() != leaf.dtype() || incoming.device() != leaf.device()) {
      incoming = incoming.to(leaf.device(), leaf.dtype());
    }
    meta.grad = meta.grad.defined() ? add(meta.grad, incoming) : incoming;
    for (auto& [id, hook] : meta.hooks) hook(meta.grad);
    return;
  }
  NoGradGuard no_grad;
  if (incoming.dtype() != leaf.dtype() || incoming.device() != leaf.device()) {
    incoming = incoming.to(leaf.device(), leaf.dtype());
  }
  if (!meta.grad.defined()) {
    // Keep the engine's buffer when nothing else can see it; otherwise take a private copy, so
    // that later in-place accumulation never writes into another tensor.
    const bool exclusive = is_exclusive_gradient(incoming) && incoming.numel() == leaf.numel();
    meta.grad = exclusive ? incoming.detach() : incoming.clone();
  } else {
    // In place, so that a .grad that is a view (a DDP bucket slot) stays one.
    meta.grad.add_(incoming);
  }
  for (auto& [id, hook] : meta.hooks) hook(meta.grad);
}

bool is_exclusive_gradient(const Tensor& grad) {
  return grad.is_contiguous() && grad.impl_shared().use_count() <= 2 &&
         grad.storage().use_count() == 1;
}

// ---- Recording -------------------------------------------------------------------------------

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_mode_enabled) return false;
  for (const Tensor* input : inputs) {
    if (input->defined() && input->requires_grad()) return true;
  }
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_mode_enabled) return false;
  for (const Tensor& input : inputs) {
    if (input.defined() && input.requires_grad()) return true;
  }
  return false;
}

std::shared_ptr<Node> gradient_edge(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return nullptr;
  AutogradMeta& meta = input.autograd_meta();
  if (meta.grad_fn) return meta.grad_fn;
  if (!meta.grad_accumulator) {
    meta.grad_accumulator = std::make_shared<AccumulateGrad>(input.impl_shared());
  }
  return meta.grad_accumulator;
}

namespace {
void attach(const Tensor& result, std::shared_ptr<Node> node) {
  AutogradMeta& meta = result.autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
}
}  // namespace

Tensor with_history(const Tensor& data, std::shared_ptr<Node> grad_fn) {
  Tensor result = data.detach();
  attach(result, std::move(grad_fn));
  return result;
}

namespace {
struct StandInBackward final : Node {
  const char* name() const override { return "StandInBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override { grads[0] = grad; }
};
}  // namespace

Tensor stand_in(const Tensor& data, std::shared_ptr<Node> edge) {
  if (!edge) return data.detach();
  auto node = std::make_shared<StandInBackward>();
  node->next.push_back(std::move(edge));
  return with_history(data, std::move(node));
}

void set_history(const Tensor& result, std::shared_ptr<Node> node,
                 std::initializer_list<const Tensor*> inputs) {
  node->next.reserve(inputs.size());
  for (const Tensor* input : inputs) node->next.push_back(gradient_edge(*input));
  attach(result, std::move(node));
}

void set_history(const Tensor& result, std::shared_ptr<Node> node,
                 const std::vector<Tensor>& inputs) {
  node->next.reserve(inputs.size());
  for (const Tensor& input : inputs) node->next.push_back(gradient_edge(input));
  attach(result, std::move(node));
}

void check_inplace(const Tensor& tensor, const char* op) {
  if (!grad_mode_enabled || !tensor.requires_grad()) return;
  MPIGRAD_CHECK(!tensor.is_leaf(), op,
                ": a leaf tensor that requires grad cannot be modified in place; wrap the "
                "update in NoGradGuard (as optimizers do) or work on a copy");
  // Rewriting a view's history would leave its base's history stale, so gradients of the base
  // would silently ignore the write.
  MPIGRAD_CHECK(!tensor.impl_ptr()->is_view, op,
                ": in-place op on a view of a tensor that requires grad is not supported; use "
                "the out-of-place op (or clone() the view first)");
}

// ---- Backward --------------------------------------------------------------------------------

namespace {

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

// Scratch buffers of one backward, kept per thread so a training step allocates none of them.
// A hook that itself calls backward gets fresh ones (the outer call holds these).
struct EngineScratch {
  std::vector<std::shared_ptr<Node>> root_nodes;  // held while the run lasts
  std::vector<Node*> roots;
  std::vector<Node*> stack;
  std::vector<Node*> reachable;
  std::vector<Node*> marked;  // the nodes asked for, or the live leaves' accumulators
  std::vector<Node*> ready;
  std::vector<Tensor> grad_inputs;
  std::vector<size_t> early;
};

// Callbacks queued by hooks during the innermost backward running on this thread.
thread_local std::vector<std::function<void()>>* backward_callbacks = nullptr;
thread_local EngineScratch scratch_cache;

// Marks every node reachable from the roots with this task and counts, for each, how many edges
// of the reachable graph point at it; lists them in `reachable` when given. Iterative, so graph
// depth is not limited by the stack.
void count_dependencies(const std::vector<Node*>& roots, uint64_t task, std::vector<Node*>& stack,
                        std::vector<Node*>* reachable) {
  stack.clear();
  const auto visit = [&](Node* node) {
    node->graph_task = task;
    node->pending = 0;
    node->needed = true;
    node->grad_sum = Tensor();
    stack.push_back(node);
    if (reachable != nullptr) reachable->push_back(node);
  };
  for (Node* root : roots) {
    if (root->graph_task != task) visit(root);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& child : node->next) {
      if (!child) continue;
      if (child->graph_task != task) visit(child.get());
      ++child->pending;
    }
  }
}

// grad(): a node is needed when a tensor asked for lies at or below it; only those run, and only
// they receive gradients. Every parent of a needed node is needed too, so the pending counts of
// the needed ones stay right. Children are older than their parents (a node's inputs were
// computed first), so one pass in creation order settles each node after its children; but a
// leaf's accumulator, which has no children, sorts last (AccumulateGrad): each node's own mark,
// set first, is already final for those.
void mark_needed(std::vector<Node*>& reachable, const std::vector<Node*>& asked_for,
                 uint64_t task) {
  for (Node* node : reachable) node->needed = false;
  for (Node* node : asked_for) node->needed = node->needed || node->graph_task == task;
  std::sort(reachable.begin(), reachable.end(),
            [](const Node* a, const Node* b) { return a->sequence_nr < b->sequence_nr; });
  for (Node* node : reachable) {
    for (const auto& child : node->next) node->needed = node->needed || (child && child->needed);
  }
}

// backward(): a gradient that can flow only into leaves nobody holds any more could be read by
// nobody, so the nodes that lead to no other leaf need not run: the marks of a grad() that asks
// for the live leaves. Where every leaf is alive (most backwards) every node stays needed.
void skip_dead_leaves(std::vector<Node*>& reachable, std::vector<Node*>& live, uint64_t task) {
  live.clear();
  bool any_dead = false;
  for (Node* node : reachable) {
    // Accumulators alone carry the highest sequence number: the cast is for those only.
    if (node->sequence_nr != std::numeric_limits<uint64_t>::max()) continue;
    const auto* accumulator = dynamic_cast<const AccumulateGrad*>(node);
    if (accumulator == nullptr) continue;
    if (accumulator->leaf_alive()) {
      live.push_back(node);
    } else {
      any_dead = true;
    }
  }
  if (any_dead) mark_needed(reachable, live, task);
}

}  // namespace

namespace {

// How far release_gradient_early looks for leaves: a weight's accumulator behind its transpose,
// or behind an expand and a transpose (a batched x W^T), is two or three nodes away.
constexpr int kLeafChainDepth = 4;

// Whether every path from `node` ends in a leaf's accumulator within `depth` nodes.
bool leads_only_to_leaves(const Node& node, int depth) {
  if (dynamic_cast<const AccumulateGrad*>(&node) != nullptr) return true;
  if (depth == 0) return false;
  bool any = false;
  for (const auto& child : node.next) {
    if (!child) continue;
    if (!leads_only_to_leaves(*child, depth - 1)) return false;
    any = true;
  }
  return any;
}

// One backward in progress on this thread: its ready heap, the node whose apply is running, and
// the edges handed over early, of that node from `first_early` on (a chain run from
// release_gradient_early appends its own after them, and drops them when done).
struct BackwardRun {
  std::vector<Node*>* ready = nullptr;
  bool retain_graph = false;
  bool run_leaf_chains = true;  // false for grad(): it never runs a leaf's accumulator
  Node* node = nullptr;
  std::vector<size_t>* early = nullptr;
  size_t first_early = 0;

  bool handed_over(size_t index) const {
    return std::find(early->begin() + std::ptrdiff_t(first_early), early->end(), index) !=
           early->end();
  }
};
// See grad_mode_enabled.
[[gnu::tls_model("initial-exec")]] thread_local BackwardRun* running = nullptr;

void run_node(BackwardRun& run, Node* node, std::vector<Tensor>& grad_inputs, bool leaf_chain);

// Adds `incoming` into `child`'s gradient and counts the edge as done; a child with nothing more
// to wait for becomes ready, or, when asked and it leads only to leaves, runs now.
void hand_over(BackwardRun& run, Node* child, Tensor& incoming, bool run_leaf_chains) {
  if (incoming.defined()) {
    if (!child->grad_sum.defined()) {
      child->grad_sum = std::move(incoming);
    } else {
      child->grad_sum = add(child->grad_sum, incoming);
    }
  }
  if (--child->pending != 0) return;
  if (run_leaf_chains && run.run_leaf_chains && leads_only_to_leaves(*child, kLeafChainDepth)) {
    std::vector<Tensor> grads;  // not the caller's: it is still in use
    run_node(run, child, grads, /*leaf_chain=*/true);
    return;
  }
  run.ready->push_back(child);
  std::push_heap(run.ready->begin(), run.ready->end(), LaterFirst{});
}

// Runs `node` and hands its gradients on. In a leaf chain (see hand_over) what it completes runs
// at once too; otherwise it waits in the heap.
void run_node(BackwardRun& run, Node* node, std::vector<Tensor>& grad_inputs, bool leaf_chain) {
  Tensor grad = std::move(node->grad_sum);
  node->grad_sum = Tensor();
  grad_inputs.assign(node->next.size(), Tensor());
  struct Restore {
    BackwardRun& run;
    Node* node;
    size_t first_early;
    ~Restore() {
      run.early->resize(run.first_early);
      run.node = node;
      run.first_early = first_early;
    }
  } restore{run, run.node, run.first_early};
  run.node = node;
  run.first_early = run.early->size();
  // Grad mode is on exactly in a backward with create_graph.
  MPIGRAD_CHECK(!grad_mode_enabled || node->differentiable_backward(),
                "backward with create_graph: ", node->name(),
                " has no second derivative yet (its backward is a first-order kernel), so the "
                "gradient through it cannot be differentiated again");
  if (grad.defined()) {
    ProfileSpan span(ProfileKind::Backward, [node] { return node->name(); });
    node->apply(grad, grad_inputs);
  }
  // Dropped before the children run (a leaf chain runs them from here): a view's gradient shares
  // this one's storage, and AccumulateGrad adopts a buffer as .grad only if nothing else holds it.
  grad = Tensor();
  if (!run.retain_graph) node->release_saved();
  const bool any_early = run.early->size() > run.first_early;
  for (size_t i = 0; i < node->next.size(); ++i) {
    Node* child = node->next[i].get();
    if (child == nullptr || !child->needed || (any_early && run.handed_over(i))) continue;
    hand_over(run, child, grad_inputs[i], /*run_leaf_chains=*/leaf_chain);
  }
}

}  // namespace

bool gradient_needed(const Node& node, size_t index) {
  if (index >= node.next.size() || !node.next[index]) return false;
  // The engine's marks are current for the nodes below the one it runs.
  return running == nullptr || running->node != &node || node.next[index]->needed;
}

void release_gradient_early(const Node& node, std::vector<Tensor>& grads, size_t index) {
  if (running == nullptr || running->node != &node) return;
  BackwardRun& run = *running;
  MPIGRAD_CHECK(index < node.next.size() && index < grads.size() && !run.handed_over(index),
                "release_gradient_early: ", node.name(), " has no gradient ", index,
                " left to hand over");
  run.early->push_back(index);
  Node* child = node.next[index].get();
  if (child == nullptr || !child->needed) {
    grads[index] = Tensor();
    return;
  }
  Tensor incoming = std::move(grads[index]);
  grads[index] = Tensor();
  hand_over(run, child, incoming, /*run_leaf_chains=*/true);
}

namespace {

// Sets grad mode for a scope and restores it.
class GradModeScope {
 public:
  explicit GradModeScope(bool enabled) : previous_(grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeScope() { set_grad_enabled(previous_); }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool previous_;
};

// The seed of `output`: `gradient`, checked against it, or ones for a one-element output.
Tensor seed_for(const Tensor& output, const Tensor& gradient, const std::string& what) {
  MPIGRAD_CHECK(output.defined(), what, ": the tensor is undefined");
  MPIGRAD_CHECK(output.requires_grad(), what,
                ": the tensor does not require grad and has no grad_fn; did a NoGradGuard or "
                "detach() cut it from the graph?");
  if (!gradient.defined()) {
    MPIGRAD_CHECK(output.numel() == 1, what,
                  ": a gradient can be implied only for one-element outputs; this one has "
                  "shape ",
                  output.shape(), ", so pass its gradient");
    return ones_like(output);
  }
  MPIGRAD_CHECK(gradient.shape() == output.shape(), what, ": gradient shape ", gradient.shape(),
                " does not match the output shape ", output.shape());
  return gradient;
}

// A node that grad() asked for, and where its gradient goes.
struct AskedFor {
  Node* node;
  std::vector<size_t> inputs;
};

// Runs the graph below `outputs`, seeded with `seeds`. With `asked` (grad()), only the nodes
// leading to those run, each one's complete gradient is stored into `results`, and no leaf's
// accumulator runs; otherwise every reachable node runs (backward()).
void run_backward(std::span<const Tensor> outputs, std::span<const Tensor> seeds, bool retain_graph,
                  bool create_graph, const std::vector<AskedFor>* asked,
                  std::vector<Tensor>* results) {
  EngineScratch scratch = std::move(scratch_cache);
  std::vector<std::shared_ptr<Node>>& root_nodes = scratch.root_nodes;
  std::vector<Node*>& roots = scratch.roots;
  root_nodes.clear();
  roots.clear();
  for (const Tensor& output : outputs) {
    root_nodes.push_back(gradient_edge(output));
    roots.push_back(root_nodes.back().get());
  }
  const uint64_t task = next_graph_task.fetch_add(1, std::memory_order_relaxed);
  scratch.reachable.clear();
  count_dependencies(roots, task, scratch.stack, &scratch.reachable);
  std::vector<Node*>& marked = scratch.marked;
  marked.clear();
  if (asked != nullptr) {
    for (const AskedFor& entry : *asked) marked.push_back(entry.node);
    mark_needed(scratch.reachable, marked, task);
  } else {
    skip_dead_leaves(scratch.reachable, marked, task);
  }
  // Gradients are differentiated again exactly when create_graph asks for it.
  GradModeScope grad_mode(create_graph);
  std::vector<Node*>& ready = scratch.ready;
  ready.clear();
  for (size_t i = 0; i < roots.size(); ++i) {
    Node* root = roots[i];
    if (!root->needed) continue;
    // A seed the caller passed keeps its history only when it is to be differentiated. (One
    // with no history is taken as it is: the engine only reads it, and a leaf's accumulator
    // copies a buffer that the caller still holds.)
    Tensor seed = create_graph || !seeds[i].requires_grad() ? seeds[i] : seeds[i].detach();
    root->grad_sum = root->grad_sum.defined() ? add(root->grad_sum, seed) : seed;
  }
  for (Node* root : roots) {
    if (root->needed && root->pending == 0 &&
        std::find(ready.begin(), ready.end(), root) == ready.end()) {
      ready.push_back(root);
    }
  }
  std::make_heap(ready.begin(), ready.end(), LaterFirst{});

  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* outer_callbacks = backward_callbacks;
  backward_callbacks = &callbacks;
  BackwardRun run;
  run.ready = &ready;
  run.retain_graph = retain_graph || create_graph;
  run.run_leaf_chains = asked == nullptr;
  run.early = &scratch.early;
  scratch.early.clear();
  BackwardRun* outer_run = running;  // a hook that calls backward nests a run of its own
  running = &run;
  struct Restore {
    std::vector<std::function<void()>>* callbacks;
    BackwardRun* run;
    ~Restore() {
      backward_callbacks = callbacks;
      running = run;
    }
  } restore{outer_callbacks, outer_run};
  LaterFirst later_first;
  std::vector<Tensor>& grad_inputs = scratch.grad_inputs;
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), later_first);
    Node* node = ready.back();
    ready.pop_back();
    if (asked != nullptr) {
      for (const AskedFor& entry : *asked) {
        if (entry.node != node) continue;
        for (size_t input : entry.inputs) (*results)[input] = node->grad_sum;
      }
      // What lies below matters only where another tensor asked for does; a leaf's .grad is
      // never touched.
      bool goes_on = dynamic_cast<AccumulateGrad*>(node) == nullptr;
      if (goes_on) {
        goes_on = false;
        for (const auto& child : node->next) goes_on = goes_on || (child && child->needed);
      }
      if (!goes_on) {
        node->grad_sum = Tensor();
        continue;
      }
    }
    run_node(run, node, grad_inputs, /*leaf_chain=*/false);
  }
  grad_inputs.clear();
  root_nodes.clear();
  scratch_cache = std::move(scratch);
  running = outer_run;
  // Callbacks may queue further callbacks; run until none are left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> callback = std::move(callbacks[i]);
    callback();
  }
}

}  // namespace

void backward(const Tensor& root, const Tensor& gradient, bool retain_graph, bool create_graph) {
  Tensor seed = seed_for(root, gradient, "backward");
  // An implied seed of ones is the engine's own buffer; a passed one is the caller's.
  run_backward({&root, 1}, {&seed, 1}, retain_graph, create_graph, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, GradOptions options) {
  MPIGRAD_CHECK(!outputs.empty(), "grad: no outputs given");
  MPIGRAD_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
                "grad: ", grad_outputs.size(), " grad_outputs for ", outputs.size(),
                " outputs; give one per output, or none");
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    seeds.push_back(seed_for(outputs[i], grad_outputs.empty() ? Tensor() : grad_outputs[i],
                             "grad: outputs[" + std::to_string(i) + "]"));
  }
  std::vector<AskedFor> asked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    MPIGRAD_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad: inputs[", i,
                  "] does not require grad; mark it with set_requires_grad() before computing "
                  "the outputs from it");
    Node* node = gradient_edge(inputs[i]).get();
    auto found = std::find_if(asked.begin(), asked.end(),
                              [&](const AskedFor& entry) { return entry.node == node; });
    if (found == asked.end()) {
      asked.push_back({node, {i}});
    } else {
      found->inputs.push_back(i);
    }
  }
  std::vector<Tensor> results(inputs.size());
  run_backward(outputs, seeds, options.retain_graph, options.create_graph, &asked, &results);
  for (size_t i = 0; i < inputs.size(); ++i) {
    MPIGRAD_CHECK(results[i].defined() || options.allow_unused, "grad: inputs[", i, "] (shape ",
                  inputs[i].shape(),
                  ") was not used to compute the outputs; pass allow_unused = true to get an "
                  "undefined gradient for it");
    // Without create_graph a gradient is a plain tensor, as .grad is.
    if (results[i].defined() && !options.create_graph) results[i] = results[i].detach();
  }
  return results;
}

void queue_backward_callback(std::function<void()> callback) {
  MPIGRAD_CHECK(backward_callbacks != nullptr,
                "queue_backward_callback: no backward is running on this thread");
  backward_callbacks->push_back(std::move(callback));
}

void zero_grad(const std::vector<Tensor>& leaves, bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor leaf : leaves) {
    Tensor grad = leaf.grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      leaf.set_grad(Tensor());
    } else {
      grad.zero_();
    }
  }
}

}  // namespace mpigrad::core
