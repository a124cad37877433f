// A subset of a parent communicator's ranks with its own communicator, for collectives that only
// some ranks take part in (model-parallel blocks, per-node reductions, hierarchical all-reduce).
// Splitting is collective over the parent: every parent rank calls the same factory, and each
// ends up in exactly one group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mpigrad/launch/comm/communicator.h"

namespace mpigrad::launch {

class ProcessGroup {
 public:
  // Contiguous blocks of block_size parent ranks: {0..k-1}, {k..2k-1}, ...; the last block may
  // be smaller when block_size does not divide the parent's size.
  static ProcessGroup blocks(Communicator& parent, int block_size);
  // Ranks passing the same color (>= 0) form one group, ordered by parent rank.
  static ProcessGroup by_color(Communicator& parent, int color);
  // The ranks of the parent that share this node.
  static ProcessGroup node_local(Communicator& parent);

  int color() const { return color_; }
  // The parent ranks in this group, in group-rank order.
  const std::vector<int>& parent_ranks() const { return parent_ranks_; }
  int rank() const { return communicator_->rank(); }
  int size() const { return communicator_->size(); }
  Communicator& communicator() const { return *communicator_; }

 private:
  ProcessGroup(Communicator& parent, std::unique_ptr<Communicator> communicator, int color);
  std::unique_ptr<Communicator> communicator_;
  int color_ = 0;
  std::vector<int> parent_ranks_;
};

}  // namespace mpigrad::launch
