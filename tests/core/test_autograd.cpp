// Autograd engine behaviour beyond single-op gradients (those are in test_ops.cpp): accumulation,
// graph release, grad mode, detach, in-place rules and version checks, and the grad-ready hooks
// whose timing the DDP layer depends on (a leaf's hook must fire as soon as its gradient is
// final, before backward reaches the earlier layers).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"

namespace {

using namespace mpigrad::core;  // NOLINT

Tensor leaf(std::vector<double> values) {
  const int64_t n = int64_t(values.size());
  return Tensor::from_vector(values, {n}, kFloat64).set_requires_grad(true);
}

std::vector<double> grad_of(const Tensor& t) {
  REQUIRE(t.grad().defined());
  return t.grad().to_vector<double>();
}

bool mentions_inplace(const std::string& message) {
  return message.find("in-place") != std::string::npos ||
         message.find("inplace") != std::string::npos;
}

}  // namespace

TEST_CASE("gradients accumulate across backward calls when the graph is retained") {
  Tensor x = leaf({1.0, -2.0, 3.0});
  Tensor loss = sum(x * x);
  loss.backward(Tensor(), /*retain_graph=*/true);
  CHECK(grad_of(x) == std::vector<double>{2.0, -4.0, 6.0});
  loss.backward();
  CHECK(grad_of(x) == std::vector<double>{4.0, -8.0, 12.0});

  // A second backward without retained graph must refuse, not read freed saved tensors.
  CHECK_THROWS_AS(loss.backward(), Error);

  // A fresh graph adds onto the existing .grad; set_grad resets it.
  sum(x * 3.0).backward();
  CHECK(grad_of(x) == std::vector<double>{7.0, -5.0, 15.0});
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
  sum(x).backward();
  CHECK(grad_of(x) == std::vector<double>{1.0, 1.0, 1.0});
}

TEST_CASE("a second backward without retain_graph says how to fix it") {
  Tensor x = leaf({2.0});
  Tensor y = sum(exp(x) * x);
  y.backward();
  try {
    y.backward();
    FAIL("second backward did not throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
}

TEST_CASE("a second backward names the graph and the node whose saved tensors are gone") {
  Tensor x = leaf({2.0, 3.0});
  Tensor y = sum(x * x);
  y.backward();
  try {
    y.backward();
    FAIL("second backward did not throw");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(message.find("Trying to backward through the graph a second time") != std::string::npos);
    CHECK(message.find("MulBackward") != std::string::npos);
  }
}

TEST_CASE("backward frees each saved activation once its node has run, unless retained") {
  for (bool retain : {false, true}) {
    CAPTURE(retain);
    Tensor x = leaf(std::vector<double>(1000, 0.5));
    // h is saved only by the product below; the graph is its last owner once h goes.
    Tensor h = x * 2.0;
    std::weak_ptr<Storage> activation = h.storage();
    Tensor y = sum(h * h);
    h = Tensor();
    REQUIRE_FALSE(activation.expired());
    // x's hook runs after the product's node and before backward returns.
    bool freed_at_hook = false;
    x.register_grad_ready_hook([&](Tensor&) { freed_at_hook = activation.expired(); });
    y.backward(Tensor(), retain);
    CHECK(freed_at_hook == !retain);
    CHECK(activation.expired() == !retain);
    CHECK(grad_of(x) == std::vector<double>(1000, 4.0));  // d/dx sum((2x)^2) = 8x
    if (retain) {
      y.backward();  // the retained graph runs again, and frees this time
      CHECK(grad_of(x) == std::vector<double>(1000, 8.0));
      CHECK(activation.expired());
    }
  }
}

TEST_CASE("backward argument checks") {
  Tensor x = leaf({1.0, 2.0});
  // A gradient may only be omitted for a one-element root.
  CHECK_THROWS_AS((x * 2.0).backward(), Error);
  CHECK_THROWS_AS(ones({1}).backward(), Error);  // nothing requires grad
  (x * 2.0).backward(Tensor::from_vector<double>({1.0, 10.0}, {2}));
  CHECK(grad_of(x) == std::vector<double>{2.0, 20.0});
}

TEST_CASE("requires_grad propagation, leaves and grad_fn") {
  Tensor x = leaf({1.0, 2.0});
  Tensor c = Tensor::from_vector<double>({3.0, 4.0}, {2});
  CHECK(x.is_leaf());
  CHECK(x.requires_grad());
  CHECK_FALSE(x.grad_fn());
  CHECK_FALSE(c.requires_grad());

  Tensor y = x * c;
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  REQUIRE(y.grad_fn());
  CHECK(std::string(y.grad_fn()->name()).size() > 0);
  CHECK_FALSE((c * c).requires_grad());
  CHECK((c * c).is_leaf());
  CHECK(x.slice(0, 0, 1).requires_grad());  // views of a leaf are part of the graph

  // Only leaves hold .grad; an intermediate does not get one.
  sum(y).backward();
  CHECK(grad_of(x) == std::vector<double>{3.0, 4.0});
  CHECK_FALSE(y.grad().defined());
  CHECK_FALSE(c.grad().defined());

  CHECK_THROWS_AS(y.set_requires_grad(true), Error);  // non-leaf
  Tensor options_leaf = zeros({2}, TensorOptions().dtype(kFloat64).requires_grad());
  CHECK(options_leaf.requires_grad());
  CHECK(options_leaf.is_leaf());
}

TEST_CASE("NoGradGuard stops recording and restores the previous mode") {
  Tensor x = leaf({1.0, 2.0});
  CHECK(grad_enabled());
  {
    NoGradGuard outer;
    CHECK_FALSE(grad_enabled());
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK_FALSE(y.grad_fn());
    {
      NoGradGuard inner;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the inner guard restores "off", not "on"

    // Grad mode is per thread: another thread still records.
    bool other_thread_enabled = false;
    std::thread([&] { other_thread_enabled = grad_enabled(); }).join();
    CHECK(other_thread_enabled);
  }
  CHECK(grad_enabled());
  CHECK((x * 2.0).requires_grad());
}

TEST_CASE("detach shares storage and cuts the graph") {
  Tensor x = leaf({1.0, 2.0, 3.0});
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.storage() == x.storage());
  // d(x * detach(x))/dx = detach(x): the detached factor is a constant.
  sum(x * d).backward();
  CHECK(grad_of(x) == std::vector<double>{1.0, 2.0, 3.0});
}

TEST_CASE("in-place ops on leaves that require grad are refused while grad mode is on") {
  Tensor x = leaf({1.0, 2.0});
  CHECK_THROWS_AS(x.add_(1.0), Error);
  CHECK_THROWS_AS(x.mul_(2.0), Error);
  CHECK_THROWS_AS(x.fill_(0.0), Error);
  CHECK_THROWS_AS(x.copy_(zeros({2}, kFloat64)), Error);
  CHECK(x.to_vector<double>() == std::vector<double>{1.0, 2.0});  // nothing was written

  // An optimizer update runs under no-grad and is allowed.
  const uint32_t before = x.version();
  {
    NoGradGuard no_grad;
    x.add_(Tensor::from_vector<double>({0.5, 0.5}, {2}), -2.0);
  }
  CHECK(x.to_vector<double>() == std::vector<double>{0.0, 1.0});
  CHECK(x.version() > before);
  CHECK(x.is_leaf());
  CHECK(x.requires_grad());
}

TEST_CASE("in-place writes through a view of a leaf that requires grad are refused") {
  // Like PyTorch: otherwise the leaf's values change behind autograd's back.
  Tensor x = leaf({1.0, 2.0, 3.0});
  CHECK_THROWS_AS(x.slice(0, 0, 2).fill_(0.0), Error);
  CHECK(x.to_vector<double>() == std::vector<double>{1.0, 2.0, 3.0});
}

TEST_CASE("modifying a tensor saved for backward makes backward throw") {
  SUBCASE("an input saved by mul, modified directly") {
    Tensor x = leaf({1.0, 2.0});
    Tensor a = x * 2.0;
    Tensor b = a * a;  // saves a
    a.add_(1.0);
    try {
      sum(b).backward();
      FAIL("backward used a tensor modified in place");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(mentions_inplace(e.what()));
    }
  }
  SUBCASE("an input saved by mul, modified through a view") {
    Tensor x = leaf({1.0, 2.0});
    Tensor a = x * 2.0;
    Tensor b = a * a;
    {
      NoGradGuard no_grad;  // the write itself is not part of the graph
      a.select(0, 0).fill_(5.0);
    }
    CHECK_THROWS_AS(sum(b).backward(), Error);
  }
  SUBCASE("an output saved by exp") {
    Tensor x = leaf({0.5, 1.5});
    Tensor y = exp(x);  // backward reads y itself
    Tensor z = y * 1.0;
    y.mul_(2.0);
    // Whether or not mul_ is recorded, exp's saved output is stale: backward through z uses it.
    CHECK_THROWS_AS(sum(z).backward(), Error);
  }
}

TEST_CASE("in-place ops on non-leaf tensors are differentiable") {
  Tensor x = leaf({1.0, -2.0});
  Tensor z = leaf({4.0, 5.0});
  Tensor y = x * 2.0;
  y.add_(z, 3.0);  // y = 2x + 3z
  y.add_(1.0);
  sum(y * y).backward();
  // d/dx sum(y^2) = 2y * 2, d/dz = 2y * 3, with y = {15, 12}.
  CHECK(grad_of(x) == std::vector<double>{60.0, 48.0});
  CHECK(grad_of(z) == std::vector<double>{90.0, 72.0});

  Tensor w = leaf({1.0, 3.0});
  Tensor v = w * 1.5;
  v.mul_(2.0);
  v.relu_();
  sum(v).backward();
  CHECK(grad_of(w) == std::vector<double>{3.0, 3.0});
}

TEST_CASE("grad-ready hooks fire once, latest layer first, before earlier layers' backward") {
  // Three "layers" y = w3 * (w2 * (w1 * x)): backward reaches w3 first and w1 last.
  Tensor x = Tensor::from_vector<double>({1.0, 2.0}, {2});
  Tensor w1 = leaf({2.0, 3.0});
  Tensor w2 = leaf({5.0, 7.0});
  Tensor w3 = leaf({11.0, 13.0});
  std::vector<std::string> order;
  bool w1_grad_absent_in_w3_hook = false;
  bool w2_grad_absent_in_w3_hook = false;
  std::vector<double> w3_grad_in_hook;

  w1.register_grad_ready_hook([&](Tensor&) { order.push_back("w1"); });
  w2.register_grad_ready_hook([&](Tensor&) { order.push_back("w2"); });
  w3.register_grad_ready_hook([&](Tensor& grad) {
    order.push_back("w3");
    // The DDP overlap relies on this: w3's gradient is handed over while w1's is not computed.
    w1_grad_absent_in_w3_hook = !w1.grad().defined();
    w2_grad_absent_in_w3_hook = !w2.grad().defined();
    w3_grad_in_hook = grad.to_vector<double>();
  });

  sum(w3 * (w2 * (w1 * x))).backward();
  CHECK(order == std::vector<std::string>{"w3", "w2", "w1"});
  CHECK(w1_grad_absent_in_w3_hook);
  CHECK(w2_grad_absent_in_w3_hook);
  CHECK(w3_grad_in_hook == std::vector<double>{10.0, 42.0});  // w2 * w1 * x
  CHECK(grad_of(w1) == std::vector<double>{55.0, 182.0});
  CHECK(grad_of(w2) == std::vector<double>{22.0, 78.0});
}

// A node that computes its second input's gradient first and hands it over early, as matmul
// and conv2d do for their weights, recording whether the rest of it had run by then.
struct EarlySecondInput final : Node {
  bool* rest_done = nullptr;
  const void* released_data = nullptr;  // where the early gradient's values are
  const char* name() const override { return "EarlySecondInput"; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    grads[1] = grad * 2.0;
    released_data = grads[1].data_ptr();
    release_gradient_early(*this, grads, 1);
    CHECK_FALSE(grads[1].defined());  // handed over: the engine owns it now
    grads[0] = grad * 3.0;
    *rest_done = true;
  }
};

Tensor early_second_input(const Tensor& a, const Tensor& b, bool* rest_done,
                          std::shared_ptr<EarlySecondInput>* keep = nullptr) {
  Tensor out = Tensor::from_vector<double>(a.to_vector<double>(), {a.numel()});
  auto node = std::make_shared<EarlySecondInput>();
  node->rest_done = rest_done;
  set_history(out, node, {&a, &b});
  if (keep != nullptr) *keep = node;
  return out;
}

TEST_CASE("a gradient released early reaches its leaf's hook before the node finishes") {
  bool rest_done = false;
  bool rest_done_in_w_hook = true;
  Tensor x = leaf({1.0, 2.0});
  Tensor w = leaf({3.0, 4.0});
  std::vector<std::string> order;
  x.register_grad_ready_hook([&](Tensor&) { order.push_back("x"); });
  w.register_grad_ready_hook([&](Tensor&) {
    order.push_back("w");
    rest_done_in_w_hook = rest_done;
  });
  // x * 1.0: the first input's edge is an op, not a leaf; w's edge is w's accumulator.
  sum(early_second_input(x * 1.0, w, &rest_done)).backward();
  CHECK_FALSE(rest_done_in_w_hook);
  CHECK(order == std::vector<std::string>{"w", "x"});
  CHECK(grad_of(w) == std::vector<double>{2.0, 2.0});
  CHECK(grad_of(x) == std::vector<double>{3.0, 3.0});

  // Through a view of the leaf (W.t()'s transpose, a reshape): still handed over at once.
  Tensor v = leaf({5.0, 6.0});
  rest_done = false;
  rest_done_in_w_hook = true;
  v.register_grad_ready_hook([&](Tensor&) { rest_done_in_w_hook = rest_done; });
  std::shared_ptr<EarlySecondInput> node;
  sum(early_second_input(x * 1.0, v.reshape({2, 1}).reshape({2}), &rest_done, &node)).backward();
  CHECK_FALSE(rest_done_in_w_hook);
  CHECK(grad_of(v) == std::vector<double>{2.0, 2.0});
  // v's first gradient is the node's own buffer, through the views, not a copy of it: nothing
  // of the chain that ran from inside the node may still hold it when v's accumulator runs.
  CHECK(v.grad().data_ptr() == node->released_data);
}

TEST_CASE("an early gradient into a leaf used twice fires the hook once, with the sum") {
  bool rest_done = false;
  Tensor w = leaf({1.0, 2.0});
  int calls = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](Tensor& grad) {
    ++calls;
    seen = grad.to_vector<double>();
  });
  // w feeds the early edge and, through exp, the late one.
  sum(early_second_input(exp(w), w, &rest_done)).backward();
  CHECK(calls == 1);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == doctest::Approx(2.0 + 3.0 * std::exp(1.0)));
  CHECK(seen[1] == doctest::Approx(2.0 + 3.0 * std::exp(2.0)));
}

TEST_CASE("an early gradient into a node that waits for more gradients runs in order, as before") {
  bool rest_done = false;
  bool rest_done_in_w_hook = false;
  Tensor w = leaf({3.0, 4.0});
  w.register_grad_ready_hook([&](Tensor&) { rest_done_in_w_hook = rest_done; });
  // h feeds both edges: the early gradient cannot finish h's backward before the late one.
  Tensor h = exp(w);
  sum(early_second_input(h * 1.0, h, &rest_done)).backward();
  CHECK(rest_done_in_w_hook);
  CHECK(grad_of(w)[0] == doctest::Approx(5.0 * std::exp(3.0)));
  CHECK(grad_of(w)[1] == doctest::Approx(5.0 * std::exp(4.0)));
}

TEST_CASE("matmul hands the weight's gradient over before it computes the input's") {
  // A Linear layer's x W^T: W's hook (DDP starts W's bucket there) must fire before the input's
  // gradient, a second GEMM as large, is computed. x0 is a leaf, whose accumulator would
  // otherwise run first; its hook can only fire after that GEMM.
  Tensor x0 =
      Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat64).set_requires_grad(true);
  Tensor w =
      Tensor::from_vector<double>({1, 0, -1, 2, 1, 0}, {2, 3}, kFloat64).set_requires_grad(true);
  std::vector<std::string> order;
  w.register_grad_ready_hook([&](Tensor&) { order.push_back("w"); });
  x0.register_grad_ready_hook([&](Tensor&) { order.push_back("x"); });
  sum(matmul(x0, w.t())).backward();
  CHECK(order == std::vector<std::string>{"w", "x"});
  // d/dW sum(x W^T) = column sums of x, per output row; d/dx = row sums of W, per input.
  CHECK(w.grad().to_vector<double>() == std::vector<double>{5, 7, 9, 5, 7, 9});
  CHECK(x0.grad().to_vector<double>() == std::vector<double>{3, 1, -1, 3, 1, -1});
}

TEST_CASE("a hook on a leaf used twice fires once with the summed gradient") {
  Tensor w = leaf({1.0, 2.0});
  Tensor a = Tensor::from_vector<double>({3.0, 4.0}, {2});
  Tensor b = Tensor::from_vector<double>({-10.0, 0.5}, {2});
  int calls = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](Tensor& grad) {
    ++calls;
    seen = grad.to_vector<double>();
  });
  sum(w * a + exp(w) * b).backward();
  CHECK(calls == 1);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == doctest::Approx(3.0 - 10.0 * std::exp(1.0)));
  CHECK(seen[1] == doctest::Approx(4.0 + 0.5 * std::exp(2.0)));
  CHECK(grad_of(w) == seen);
}

TEST_CASE("hooks fire once per backward and stop after removal") {
  Tensor w = leaf({1.0});
  int first = 0, second = 0;
  const int first_id = w.register_grad_ready_hook([&](Tensor&) { ++first; });
  const int second_id = w.register_grad_ready_hook([&](Tensor&) { ++second; });
  CHECK(first_id != second_id);
  Tensor loss = sum(w * w);
  loss.backward(Tensor(), true);
  CHECK(first == 1);
  CHECK(second == 1);
  w.remove_grad_ready_hook(first_id);
  loss.backward();
  CHECK(first == 1);
  CHECK(second == 2);
  w.remove_grad_ready_hook(second_id);
  sum(w * 3.0).backward();
  CHECK(second == 2);
}

TEST_CASE("a 100000-op chain backprops and is destroyed without overflowing the stack") {
  constexpr int kDepth = 100000;
  Tensor x = leaf({1.0, 2.0});
  int hook_calls = 0;
  x.register_grad_ready_hook([&](Tensor&) { ++hook_calls; });
  {
    Tensor h = x;
    for (int i = 0; i < kDepth; ++i) h = h + x;  // h = (kDepth + 1) * x
    sum(h).backward();
  }
  CHECK(hook_calls == 1);
  CHECK(grad_of(x) == std::vector<double>{kDepth + 1.0, kDepth + 1.0});

  // Freeing a graph must be iterative too: a chain of shared_ptr edges released recursively
  // overflows an 8 MiB stack somewhere between 100k and 300k nodes in an optimized build, so
  // this one is deeper. It is never run, so only its destruction is tested.
  {
    Tensor h = x;
    for (int i = 0; i < 5 * kDepth; ++i) h = h + x;
    CHECK(h.requires_grad());
  }
  CHECK(hook_calls == 1);
}

TEST_CASE("freeing a graph whose node has more inputs than fit inline frees every node") {
  // ~Node releases its inputs through a list that keeps its first 8 on the stack frame and
  // the rest on the heap; a concatenation of 20 long chains needs both.
  Tensor x = leaf({1.0, 2.0});
  std::vector<std::weak_ptr<Node>> watched;
  {
    std::vector<Tensor> parts;
    for (int p = 0; p < 20; ++p) {
      Tensor h = x * double(p + 1);
      for (int i = 0; i < 5000; ++i) h = h + x;
      watched.push_back(h.grad_fn());
      parts.push_back(h);
    }
    Tensor joined = cat(parts, 0);
    watched.push_back(joined.grad_fn());
    parts.clear();
    for (const auto& node : watched) CHECK_FALSE(node.expired());
    sum(joined).backward();
  }
  for (const auto& node : watched) CHECK(node.expired());
  // d/dx of sum over p of (p + 1) x + 5000 x, in both halves of the concatenation.
  const double expected = 210.0 + 20 * 5000.0;
  CHECK(grad_of(x) == std::vector<double>{expected, expected});
}

TEST_CASE("a seed passed to backward is read, never kept: changing it later leaves .grad alone") {
  Tensor x = leaf({1.0, 2.0});
  Tensor seed = Tensor::from_vector<double>({3.0, 4.0}, {2});
  x.backward(seed);  // the root is x's own accumulator: the seed would become .grad if adopted
  (x * 2.0).backward(seed);
  seed.mul_(10.0);
  CHECK(grad_of(x) == std::vector<double>{9.0, 12.0});
}

TEST_CASE("callbacks queued during backward run once it has finished") {
  Tensor w1 = Tensor::from_vector<double>({2.0}, {1}).set_requires_grad();
  Tensor w2 = Tensor::from_vector<double>({3.0}, {1}).set_requires_grad();
  std::vector<std::string> events;
  w2.register_grad_ready_hook([&](Tensor&) {
    events.push_back("w2 ready");
    queue_backward_callback([&] {
      // By now every gradient of this backward is final.
      events.push_back("callback, w1 grad defined: " + std::to_string(w1.grad().defined()));
    });
  });
  w1.register_grad_ready_hook([&](Tensor&) { events.push_back("w1 ready"); });
  sum(w1 * (w2 * w2)).backward();
  // w1's gradient is final first (it comes straight from the outer mul); the callback, queued
  // by w2's hook, still runs after both.
  REQUIRE(events.size() == 3);
  CHECK(events[0] == "w1 ready");
  CHECK(events[1] == "w2 ready");
  CHECK(events[2] == "callback, w1 grad defined: 1");
  CHECK_THROWS_AS(queue_backward_callback([] {}), Error);
}
