// The public API of mpigrad in one include: #include <mpigrad/mpigrad.h>.
//
// The API is exactly three headers, and what they include:
// - this one, for C++ programs;
// - mpigrad/launch/mpi_interop.h, the one header that includes <mpi.h>, for host codes that hand
//   mpigrad their own communicator (adopt_communicator, native_communicator);
// - mpigrad/mpigrad_c.h, the C API, for C and Fortran (the Fortran module `mpigrad` wraps it).
// CMake installs these and the headers they include, followed transitively
// (cmake/public_headers.cmake); every other header stays in the source tree. A header listed
// below is API; one that is installed only because a listed header includes it is not, and may
// change without notice.
//
// The line above each include names the main things its header defines (ctest `api_index`
// checks that each name is there); include that header alone to compile less.
#pragma once

// core: tensors, autograd, ops
// defines: AutocastGuard, autocast_policy, autocast_dtype
#include "mpigrad/core/autocast.h"
// defines: backward, grad, GradOptions, NoGradGuard, Node, stand_in, queue_backward_callback
#include "mpigrad/core/autograd.h"
// defines: cuda_visibility, set_cuda_home_device
#include "mpigrad/core/cuda.h"
// defines: CudaMemoryStats, cuda_memory_stats, reset_cuda_peak_stats, cuda_empty_cache
#include "mpigrad/core/cuda_allocator.h"
// defines: CudaGraph
#include "mpigrad/core/cuda_graph.h"
// defines: check_device_errors
#include "mpigrad/core/device_checks.h"
// defines: pin_memory, to_async
#include "mpigrad/core/pinned.h"
// defines: Device, kCPU, cuda
#include "mpigrad/core/device.h"
// defines: DType, kFloat32, kBool, promote_types
#include "mpigrad/core/dtype.h"
// defines: Error, MPIGRAD_CHECK
#include "mpigrad/core/error.h"
// defines: cross_entropy_rows
#include "mpigrad/core/ops/cross_entropy.h"
// defines: add, sub, mul, div, exp, log, sin, cos, relu, gelu, tanh, where, eq, lt
#include "mpigrad/core/ops/elementwise.h"
// defines: index_select, gather, scatter_add, index_add, one_hot, embedding
#include "mpigrad/core/ops/indexing.h"
// defines: cat, stack
#include "mpigrad/core/ops/join.h"
// defines: matmul
#include "mpigrad/core/ops/linalg.h"
// defines: sum, mean, var, max, min, argmax
#include "mpigrad/core/ops/reduce.h"
// defines: softmax, log_softmax
#include "mpigrad/core/ops/softmax.h"
// defines: Generator, rand, randn, bernoulli
#include "mpigrad/core/rng.h"
// defines: Stream, Event, StreamGuard
#include "mpigrad/core/stream.h"
// defines: Tensor, TensorOptions, zeros, ones, arange
#include "mpigrad/core/tensor.h"
// defines: num_threads, set_num_threads
#include "mpigrad/core/threads.h"
// defines: ProfileSpan, ProfileSession, ProfileSink, ProfilePause, ProfileKind
#include "mpigrad/core/profiler.h"
// defines: MPIGRAD_VERSION
#include "mpigrad/version.h"

// nn: modules, layers, losses, optimizers, schedulers, checkpoints
// defines: CheckpointData, save_checkpoint, load_checkpoint
#include "mpigrad/nn/checkpoint.h"
// defines: kaiming_uniform_, kaiming_normal_, xavier_uniform_, normal_
#include "mpigrad/nn/init.h"
// defines: ReLU, GELU, SiLU, Tanh, Sigmoid
#include "mpigrad/nn/layers/activation.h"
// defines: BatchNorm1d, BatchNorm2d
#include "mpigrad/nn/layers/batch_norm.h"
// defines: Sequential, Identity, Flatten
#include "mpigrad/nn/layers/container.h"
// defines: Conv2d
#include "mpigrad/nn/layers/conv.h"
// defines: BasicBlock
#include "mpigrad/nn/layers/basic_block.h"
// defines: Dropout
#include "mpigrad/nn/layers/dropout.h"
// defines: Embedding
#include "mpigrad/nn/layers/embedding.h"
// defines: LayerNorm
#include "mpigrad/nn/layers/layer_norm.h"
// defines: Linear
#include "mpigrad/nn/layers/linear.h"
// defines: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
#include "mpigrad/nn/layers/pooling.h"
// defines: cross_entropy, mse_loss, l1_loss, CrossEntropyLoss, MSELoss, BCEWithLogitsLoss
#include "mpigrad/nn/loss.h"
// defines: EncoderWithHead, make_head, l2_normalize
#include "mpigrad/nn/encoder_with_head.h"
// defines: make_mlp, make_cnn, make_resnet, make_mlp_encoder, make_cnn_encoder
#include "mpigrad/nn/models.h"
// defines: Precision, kPrecisionNames, describe_precision
#include "mpigrad/nn/mixed_precision.h"
// defines: Module
#include "mpigrad/nn/module.h"
// defines: OnnxModel, OnnxValueInfo
#include "mpigrad/nn/onnx/onnx_model.h"
// defines: OnnxEnergyModel
#include "mpigrad/nn/onnx/onnx_energy_model.h"
// defines: SchNet, SchNetOptions, shifted_softplus
#include "mpigrad/nn/schnet.h"
// defines: AtomicGraph, AtomisticModel, sum_over_structures, edge_vectors
#include "mpigrad/nn/atomistic.h"
// defines: ResNet, ResNetConfig, resnet_stages
#include "mpigrad/nn/resnet.h"
// defines: Adam, AdamW
#include "mpigrad/nn/optim/adam.h"
// defines: clip_grad_norm_
#include "mpigrad/nn/optim/clip_grad.h"
// defines: GradScaler, GradScalerOptions
#include "mpigrad/nn/optim/grad_scaler.h"
// defines: StepLR, CosineAnnealingLR, OneCycleLR, ReduceLROnPlateau
#include "mpigrad/nn/optim/lr_scheduler.h"
// defines: SGD
#include "mpigrad/nn/optim/sgd.h"
// defines: retrieval_metrics, RetrievalMetrics
#include "mpigrad/nn/retrieval_metrics.h"
// defines: SupConLoss
#include "mpigrad/nn/supcon_loss.h"
// defines: ModelEMA, SWAAverager, update_bn
#include "mpigrad/nn/weight_averaging.h"

// data: sharded HDF5 datasets, samplers, loaders
// defines: File, Dataset, AtomicFileWriter
#include "mpigrad/core/hdf5.h"
// defines: augment_views_transform, parse_augment
#include "mpigrad/data/augment.h"
// defines: AtomicDataset, dataset_atom_counts
#include "mpigrad/data/atomic_dataset.h"
// defines: AtomicStore, read_zarr_contents
#include "mpigrad/data/atomic_store.h"
// defines: AtomBudgetBatchSampler
#include "mpigrad/data/atom_budget_sampler.h"
// defines: DataLoader, DataLoaderOptions
#include "mpigrad/data/data_loader.h"
// defines: Hdf5Dataset, rank_slice
#include "mpigrad/data/hdf5_dataset.h"
// defines: MultiDataset, MultiDatasetBatchSampler
#include "mpigrad/data/multi_dataset.h"
// defines: radius_graph, radius_graph_transform, NeighborListOptions
#include "mpigrad/data/neighbor_list.h"
// defines: gather_structures, offsets_from_counts
#include "mpigrad/data/ragged_batch.h"
// defines: DistributedSampler, RandomSampler, BatchSampler
#include "mpigrad/data/sampler.h"
// defines: TensorDataset
#include "mpigrad/data/tensor_dataset.h"
// defines: normalize_transform
#include "mpigrad/data/transforms.h"

// launch: ranks, communicators, data parallelism
// defines: classification_step, classification_metrics, regression_step
#include "mpigrad/launch/train/training_steps.h"
// defines: energy_force_step, predict_energy_forces, EnergyForceLossOptions
#include "mpigrad/launch/train/atomistic_steps.h"
// defines: Communicator, ReduceOp, Backend
#include "mpigrad/launch/comm/communicator.h"
// defines: choose_rank_device
#include "mpigrad/launch/job/device_choice.h"
// defines: DistributedDataParallel
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
// defines: ZeroRedundancyOptimizer
#include "mpigrad/launch/ddp/zero_redundancy.h"
// defines: DistributedManager
#include "mpigrad/launch/job/distributed_manager.h"
// defines: gather_embeddings
#include "mpigrad/launch/train/embeddings.h"
// defines: RetrievalMetricsHook
#include "mpigrad/launch/train/hooks/retrieval_metrics_hook.h"
// defines: EmbeddedModel
#include "mpigrad/launch/insitu/embedded_model.h"
// defines: ProcessGroup
#include "mpigrad/launch/comm/process_group.h"
// defines: RankLogger, rank_seed
#include "mpigrad/launch/observe/rank_logging.h"
// defines: SyncBatchNorm, convert_sync_batchnorm
#include "mpigrad/launch/ddp/sync_batch_norm.h"
// defines: EventFileWriter
#include "mpigrad/launch/observe/event_file_writer.h"
// defines: Timeline, Span
#include "mpigrad/launch/observe/timeline.h"
// defines: OpProfiler, OpProfile, OpProfileReport, format_op_profile, op_profile_json
#include "mpigrad/launch/observe/op_profile.h"
// defines: Hook, HookStage, HookPlace, TrainingContext
#include "mpigrad/launch/train/hook.h"
// defines: DDPHook, DistributedSamplerSettings
#include "mpigrad/launch/train/hooks/ddp_hook.h"
// defines: CheckpointHook, checkpoint_files, gather_training_state, restore_training_state
#include "mpigrad/launch/train/hooks/checkpoint_hook.h"
// defines: EMAHook
#include "mpigrad/launch/train/hooks/ema_hook.h"
// defines: GradAccumulationHook
#include "mpigrad/launch/train/hooks/grad_accumulation_hook.h"
// defines: GradClipHook
#include "mpigrad/launch/train/hooks/grad_clip_hook.h"
// defines: LoggingHook
#include "mpigrad/launch/train/hooks/logging_hook.h"
// defines: LossScalingHook
#include "mpigrad/launch/train/hooks/loss_scaling_hook.h"
// defines: LRSchedulerHook
#include "mpigrad/launch/train/hooks/lr_scheduler_hook.h"
// defines: PreemptionHook
#include "mpigrad/launch/train/hooks/preemption_hook.h"
// defines: StopSignalHandlers, kPreemptedExitStatus
#include "mpigrad/launch/train/preemption.h"
// defines: TrainingStrategy
#include "mpigrad/launch/train/training_strategy.h"
// defines: Run, RunInputs, RunKind
#include "mpigrad/launch/config/run.h"
// defines: Work
#include "mpigrad/launch/comm/work.h"
