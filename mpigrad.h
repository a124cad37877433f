// The public API of mpigrad in one include: #include <mpigrad/mpigrad.h>.
//
// Each line names the concepts a header defines; include that header alone to compile less.
// Not included here: launch/mpi_interop.h (the one header that includes <mpi.h>, for host codes
// that hand mpigrad their own communicator) and mpigrad_c.h (the C API, for C and Fortran).
//
// These headers, and the headers they include, are the installed API: CMake installs exactly
// that set (cmake/public_headers.cmake), so a header no public header reaches stays internal.
#pragma once

// core: tensors, autograd, ops
#include "mpigrad/core/autograd.h"        // defines: backward, NoGradGuard, Node, grad-ready hooks
#include "mpigrad/core/cuda.h"            // defines: cuda_visibility, set_cuda_home_device
#include "mpigrad/core/cuda_allocator.h"  // defines: the caching allocator's stats and controls
#include "mpigrad/core/device_checks.h"   // defines: check_device_errors
#include "mpigrad/core/pinned.h"          // defines: pin_memory, to_async
#include "mpigrad/core/device.h"          // defines: Device, kCPU, cuda()
#include "mpigrad/core/dtype.h"           // defines: DType, kFloat32 ... kBool, promote_types
#include "mpigrad/core/error.h"           // defines: Error, MPIGRAD_CHECK
#include "mpigrad/core/ops/cross_entropy.h" // defines: cross_entropy_rows
#include "mpigrad/core/ops/elementwise.h" // defines: add ... tanh, where, comparisons, operators
#include "mpigrad/core/ops/indexing.h"    // defines: index_select, gather, one_hot, embedding
#include "mpigrad/core/ops/join.h"        // defines: cat, stack
#include "mpigrad/core/ops/linalg.h"      // defines: matmul
#include "mpigrad/core/ops/reduce.h"      // defines: sum, mean, var, max, min, argmax
#include "mpigrad/core/ops/softmax.h"     // defines: softmax, log_softmax
#include "mpigrad/core/rng.h"             // defines: Generator, rand, randn, bernoulli
#include "mpigrad/core/stream.h"          // defines: Stream, Event, StreamGuard
#include "mpigrad/core/tensor.h"          // defines: Tensor, TensorOptions, zeros, ones, arange
#include "mpigrad/core/threads.h"         // defines: num_threads, set_num_threads
#include "mpigrad/version.h"              // defines: MPIGRAD_VERSION

// nn: modules, layers, losses, optimizers, schedulers, checkpoints
#include "mpigrad/nn/checkpoint.h"        // defines: CheckpointData, save_checkpoint, load_checkpoint
#include "mpigrad/nn/init.h"              // defines: kaiming_uniform_, xavier_uniform_, normal_, ...
#include "mpigrad/nn/layers/activation.h" // defines: ReLU, GELU, SiLU, Tanh, Sigmoid
#include "mpigrad/nn/layers/batch_norm.h" // defines: BatchNorm1d, BatchNorm2d
#include "mpigrad/nn/layers/container.h"  // defines: Sequential, Identity, Flatten
#include "mpigrad/nn/layers/conv.h"       // defines: Conv2d
#include "mpigrad/nn/layers/basic_block.h" // defines: BasicBlock
#include "mpigrad/nn/layers/dropout.h"    // defines: Dropout
#include "mpigrad/nn/layers/embedding.h"  // defines: Embedding
#include "mpigrad/nn/layers/layer_norm.h" // defines: LayerNorm
#include "mpigrad/nn/layers/linear.h"     // defines: Linear
#include "mpigrad/nn/layers/pooling.h"    // defines: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
#include "mpigrad/nn/loss.h"              // defines: cross_entropy, mse_loss, CrossEntropyLoss, ...
#include "mpigrad/nn/encoder_with_head.h" // defines: EncoderWithHead, make_head, l2_normalize
#include "mpigrad/nn/models.h"            // defines: make_mlp, make_cnn, make_resnet, make_*_encoder
#include "mpigrad/nn/module.h"            // defines: Module
#include "mpigrad/nn/resnet.h"            // defines: ResNet, ResNetConfig, resnet_stages
#include "mpigrad/nn/optim/adam.h"        // defines: Adam, AdamW
#include "mpigrad/nn/optim/clip_grad.h"   // defines: clip_grad_norm_
#include "mpigrad/nn/optim/lr_scheduler.h"// defines: StepLR, CosineAnnealingLR, OneCycleLR, ...
#include "mpigrad/nn/optim/sgd.h"         // defines: SGD
#include "mpigrad/nn/retrieval_metrics.h" // defines: retrieval_metrics (precision@1, mAP@R)
#include "mpigrad/nn/supcon_loss.h"       // defines: SupConLoss
#include "mpigrad/nn/weight_averaging.h"  // defines: ModelEMA, SWAAverager, update_bn

// data: sharded HDF5 datasets, samplers, loaders
#include "mpigrad/core/hdf5.h"              // defines: hdf5::File, Dataset, AtomicFileWriter
#include "mpigrad/data/augment.h"           // defines: augment_views_transform, parse_augment
#include "mpigrad/data/data_loader.h"       // defines: DataLoader, DataLoaderOptions
#include "mpigrad/data/hdf5_dataset.h"      // defines: Hdf5Dataset, rank_slice
#include "mpigrad/data/multi_dataset.h"     // defines: MultiDataset, MultiDatasetBatchSampler
#include "mpigrad/data/sampler.h"           // defines: DistributedSampler, RandomSampler, BatchSampler
#include "mpigrad/data/tensor_dataset.h"    // defines: TensorDataset
#include "mpigrad/data/transforms.h"        // defines: normalize_transform

// launch: ranks, communicators, data parallelism
#include "mpigrad/launch/train/training_steps.h"            // defines: classification_step, _metrics
#include "mpigrad/launch/comm/communicator.h"              // defines: Communicator, ReduceOp, Backend
#include "mpigrad/launch/job/device_choice.h"             // defines: choose_rank_device
#include "mpigrad/launch/ddp/distributed_data_parallel.h" // defines: DistributedDataParallel
#include "mpigrad/launch/job/distributed_manager.h"       // defines: DistributedManager
#include "mpigrad/launch/train/embeddings.h"                // defines: gather_embeddings, RetrievalMe...
#include "mpigrad/launch/insitu/embedded_model.h"      // defines: EmbeddedModel (in-situ training)
#include "mpigrad/launch/comm/process_group.h"             // defines: ProcessGroup
#include "mpigrad/launch/observe/rank_logging.h"              // defines: RankLogger, rank_seed
#include "mpigrad/launch/ddp/sync_batch_norm.h"           // defines: SyncBatchNorm, convert_sync_...
#include "mpigrad/launch/observe/event_file_writer.h" // defines: EventFileWriter
#include "mpigrad/launch/observe/timeline.h"            // defines: Timeline, Span
#include "mpigrad/launch/train/training_hooks.h"            // defines: DDPHook, CheckpointHook, EMAHook
#include "mpigrad/launch/train/training_strategy.h"         // defines: TrainingStrategy, Hook
#include "mpigrad/launch/comm/work.h"                      // defines: Work
