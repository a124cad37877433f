// `mpigrad embed --config F --checkpoint C --split test|train -o emb.h5 [--metrics]`: the
// embeddings of a dataset under the encoder of a two-stage model ([train] stage = supcon or
// classifier in F; the encoder's tensors come from C, as `[train] init_from` loads them).
// Every rank embeds its shard (no augmentation, no shuffle; the [data] input transform only),
// the shards are gathered with all_gather_v and the sampler's padded repeats dropped
// (launch/train/embeddings.h), and rank 0 writes, through a temporary file and a rename:
//   /embeddings  float32 [N, D]  the encoder's output (before the projection head)
//   /labels      int64 [N]       [data] y
//   /indices     int64 [N]       0 .. N-1: the rows are in dataset order
// With --metrics every rank also ranks a slice of the queries and rank 0 prints precision@1
// and mAP@R (nn/retrieval_metrics.h). Errors follow `mpigrad train`'s two phases: a bad
// argument, config or checkpoint fails on every rank before any rank embeds.
#pragma once

namespace mpigrad::launch {

// argv[0] is "embed"; returns the process exit code.
int run_embed_command(int argc, char** argv);

}  // namespace mpigrad::launch
