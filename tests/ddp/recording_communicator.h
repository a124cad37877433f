// RecordingCommunicator: forwards every collective to a real communicator and logs the start of
// each all-reduce ("all_reduce started" for async ones, "blocking all_reduce" for blocking ones),
// so tests can see when communication happens relative to backward, or that none happens.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mpigrad/launch/comm/communicator.h"

namespace mpigrad::testing {

using core::Tensor;

class RecordingCommunicator final : public launch::Communicator {
 public:
  RecordingCommunicator(launch::Communicator& inner, std::vector<std::string>& log)
      : inner_(inner), log_(log) {
    place_in_world(inner.world_ranks());
  }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  launch::Backend backend() const override { return inner_.backend(); }
  core::Device device() const override { return inner_.device(); }
  std::unique_ptr<launch::Communicator> split(int color, int key, std::string name) override {
    return inner_.split(color, key, std::move(name));
  }
  std::unique_ptr<launch::Communicator> split_node_local(std::string name) override {
    return inner_.split_node_local(std::move(name));
  }

 protected:
  // Communicator's public calls check the arguments, then come here; the inner communicator
  // checks them again, which costs a test nothing.
  launch::WorkPtr all_reduce_async_impl(const Tensor& in, const Tensor& out,
                                        launch::ReduceOp op) override {
    log_.push_back("all_reduce started");
    return inner_.all_reduce_async(in, out, op);
  }
  void all_reduce_impl(const Tensor& in, const Tensor& out, launch::ReduceOp op) override {
    log_.push_back("blocking all_reduce");
    inner_.all_reduce(in, out, op);
  }
  launch::WorkPtr broadcast_async_impl(const Tensor& t, int root) override {
    return inner_.broadcast_async(t, root);
  }
  void broadcast_impl(const Tensor& t, int root) override { inner_.broadcast(t, root); }
  launch::WorkPtr all_gather_async_impl(const Tensor& in, const Tensor& out) override {
    return inner_.all_gather_async(in, out);
  }
  void all_gather_impl(const Tensor& in, const Tensor& out) override { inner_.all_gather(in, out); }
  launch::WorkPtr all_gather_v_async_impl(const Tensor& in, const Tensor& out,
                                          std::span<const int64_t> counts) override {
    return inner_.all_gather_v_async(in, out, counts);
  }
  void all_gather_v_impl(const Tensor& in, const Tensor& out,
                         std::span<const int64_t> counts) override {
    inner_.all_gather_v(in, out, counts);
  }
  launch::WorkPtr reduce_scatter_async_impl(const Tensor& in, const Tensor& out,
                                            launch::ReduceOp op) override {
    return inner_.reduce_scatter_async(in, out, op);
  }
  void reduce_scatter_impl(const Tensor& in, const Tensor& out, launch::ReduceOp op) override {
    inner_.reduce_scatter(in, out, op);
  }
  launch::WorkPtr barrier_async_impl() override { return inner_.barrier_async(); }
  void barrier_impl() override { inner_.barrier(); }

 private:
  launch::Communicator& inner_;
  std::vector<std::string>& log_;
};

}  // namespace mpigrad::testing
