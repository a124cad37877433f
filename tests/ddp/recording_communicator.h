// RecordingCommunicator: forwards every collective to a real communicator and logs the start of
// each all-reduce ("all_reduce started" for async ones, "blocking all_reduce" for blocking ones),
// so tests can see when communication happens relative to backward, or that none happens.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mpigrad/launch/comm/communicator.h"

namespace mpigrad::testing {

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
  void run_collective(const launch::Collective& collective) override {
    if (collective.kind == launch::CollectiveKind::AllReduce) log_.push_back("blocking all_reduce");
    inner_.run(collective);
  }
  launch::WorkPtr start_collective(const launch::Collective& collective) override {
    if (collective.kind == launch::CollectiveKind::AllReduce) log_.push_back("all_reduce started");
    return inner_.start(collective);
  }

 private:
  launch::Communicator& inner_;
  std::vector<std::string>& log_;
};

}  // namespace mpigrad::testing
