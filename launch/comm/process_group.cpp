// ProcessGroup: splitting a communicator and recording which parent ranks each group holds.
#include "mpigrad/launch/comm/process_group.h"

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

ProcessGroup::ProcessGroup(Communicator& parent, std::unique_ptr<Communicator> communicator,
                           int color)
    : communicator_(std::move(communicator)), color_(color) {
  // Collective over the group: each member's parent rank, in group order.
  core::Tensor mine = core::Tensor::from_vector<int32_t>({parent.rank()}, {1});
  core::Tensor all = core::empty({communicator_->size()}, core::kInt32);
  communicator_->all_gather(mine, all);
  parent_ranks_ = all.to_vector<int32_t>();
}

ProcessGroup ProcessGroup::blocks(Communicator& parent, int block_size) {
  MPIGRAD_CHECK(block_size >= 1, parent.world_label(), " ProcessGroup::blocks on '", parent.name(),
                "': block size ", block_size, " must be at least 1");
  int color = parent.rank() / block_size;
  int groups = (parent.size() + block_size - 1) / block_size;
  std::string name =
      parent.name() + " block " + std::to_string(color) + " of " + std::to_string(groups);
  return ProcessGroup(parent, parent.split(color, parent.rank(), name), color);
}

ProcessGroup ProcessGroup::by_color(Communicator& parent, int color) {
  MPIGRAD_CHECK(color >= 0, parent.world_label(), " ProcessGroup::by_color on '", parent.name(),
                "': color ", color, " must be non-negative");
  std::string name = parent.name() + " color " + std::to_string(color);
  return ProcessGroup(parent, parent.split(color, parent.rank(), name), color);
}

ProcessGroup ProcessGroup::node_local(Communicator& parent) {
  return ProcessGroup(parent, parent.split_node_local(parent.name() + " node-local"), 0);
}

}  // namespace mpigrad::launch
