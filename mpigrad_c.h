/* mpigrad_c.h: the C API of mpigrad, for simulation codes (C, Fortran through the `mpigrad`
 * module, or C++) that train a model in-situ, one step at a time, on data they produce.
 *
 * Pure C99: it includes no MPI, CUDA or C++ header, so any C compiler builds against it. The
 * host's communicator travels as a Fortran handle (MPI_Comm_c2f in C), which mpigrad
 * duplicates; mpigrad never calls MPI_Init or MPI_Finalize for a host that owns MPI, and never
 * touches MPI_COMM_WORLD unless it is the communicator handed over.
 *
 *   mpigrad_model model;
 *   if (mpigrad_model_create(&model, "run.ini", "cpu") != MPIGRAD_SUCCESS)
 *     fprintf(stderr, "%s\n", mpigrad_last_error());
 *   int64_t in_shape[4] = {16, 1, 32, 32}, out_shape[4] = {16, 1, 32, 32};
 *   mpigrad_array u = mpigrad_host_array(u_data, 4, in_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
 *   mpigrad_array du = mpigrad_host_array(du_data, 4, out_shape, MPIGRAD_F32, MPIGRAD_ORDER_C);
 *   double loss;
 *   mpigrad_train_step(model, &u, &du, &loss);   (this rank's loss)
 *   mpigrad_model_destroy(&model);
 *
 * Configs: `config` is INI text when it holds a '=' or a line break, and otherwise the path of
 * an INI file. The keys are those of `mpigrad train` for [model] [loss] [optim] [sched] and
 * [train] seed, clip_grad_norm and grad_accum_steps; [model] input_shape and outputs, and
 * [loss] name (mse or l1 for regression, cross_entropy for classes), are required: a config
 * without them fails at create time (see docs/embedding.md, "The config"); an ONNX model
 * ([model] name = onnx, file = model.onnx) takes its shapes from the graph and needs only
 * [loss] name (input_shape when the graph leaves a sample dimension free). The models: mlp
 * (Linear layers with ReLU between them, none after the last), cnn (3x3 Conv2d, BatchNorm2d,
 * ReLU, MaxPool2d blocks, then such an mlp), conv (kxk Conv2d layers with ReLU between them,
 * the output on the input's grid), resnet (ReLU). An interatomic potential ([loss] name =
 * energy_force, [model] name = schnet or an ONNX energy model, [graph] cutoff) needs neither
 * input_shape nor outputs and takes atomic structures: see "Interatomic potentials" below.
 *
 * Arrays: an mpigrad_array describes memory the caller owns: its address, rank (1 to 8),
 * shape, optional element strides, dtype, order and place. The batch is the first dimension in
 * C order, and the last in Fortran order: a Fortran array u(32, 32, 1, 16) (x, y, channel,
 * sample) and a C array u[16][1][32][32] are the same memory and the same batch of 16 samples
 * of shape [1, 32, 32]. A sample's shape must be the model's, rank and every extent: for
 * input_shape = 1,32,32, u(1024, 16) and u(32, 32, 16) are MPIGRAD_ERROR_SHAPE, whose message
 * gives both shapes in the caller's order. An input's sample shape is [model] input_shape; a
 * regression label's and a prediction's is the model's output ([outputs] for mlp, cnn and
 * resnet, [outputs, H, W] for conv); a cross_entropy label array is [batch]. The one flattening
 * allowed is an mlp's: with a one-number input_shape (or outputs) it takes samples of any shape
 * with that many values (u[16][1][32][32] for input_shape = 1024). Data is read where it lies
 * when it is float32 (labels: float32, or int32/int64 classes for cross_entropy), dense, and in
 * the model's memory; otherwise it is converted or moved, and mpigrad_copied_bytes counts the
 * float32 (or int64 class) bytes made that way.
 *
 * Errors: every call returns an mpigrad_status; on failure mpigrad_last_error() gives the
 * message for this thread, naming the call, the argument, the shape or the file. No C++
 * exception crosses this boundary. A handle is an id, never a pointer: a destroyed or made-up
 * handle is MPIGRAD_ERROR_INVALID_HANDLE, never a crash.
 *
 * Distributed models: mpigrad_model_create_distributed and every call that trains, saves or
 * loads, mpigrad_mean_loss and mpigrad_model_destroy are collective over the model's
 * communicator (every rank calls them in the same order); mpigrad_predict, mpigrad_last_loss,
 * mpigrad_steps and mpigrad_copied_bytes are local. At creation every rank builds the model
 * from the same config and seed, and DDP checks that the models agree and broadcasts rank 0's
 * weights. Destroying frees mpigrad's duplicates of the communicator (MPI_Comm_free, collective
 * in MPI), so every rank destroys its models before the host frees the communicator or calls
 * MPI_Finalize. Checkpoints are one file, written by rank 0 atomically. Ranks in error messages
 * ("failed on rank 1", "[rank 1/4]") are numbered within the communicator the model was given,
 * mpigrad's "world", not within MPI_COMM_WORLD. A model may be used by one thread at a time.
 */
#ifndef MPIGRAD_C_H
#define MPIGRAD_C_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MPIGRAD_MAX_RANK 8

typedef enum mpigrad_status {
  MPIGRAD_SUCCESS = 0,
  MPIGRAD_ERROR_NULL_POINTER = 1,     /* a required pointer argument is NULL */
  MPIGRAD_ERROR_INVALID_HANDLE = 2,   /* a model that was never created, or destroyed */
  MPIGRAD_ERROR_INVALID_ARGUMENT = 3, /* a bad rank, order, place or device string */
  MPIGRAD_ERROR_SHAPE = 4,            /* an array's shape does not fit the model */
  MPIGRAD_ERROR_DTYPE = 5,            /* an array's dtype does not fit its use */
  MPIGRAD_ERROR_CONFIG = 6,           /* a bad config key or value, or a missing config file */
  MPIGRAD_ERROR_FILE = 7,             /* a model or checkpoint file that cannot be written/read */
  MPIGRAD_ERROR_MPI = 8,              /* MPI not initialized, or a failed MPI call */
  MPIGRAD_ERROR_UNSUPPORTED = 9,      /* e.g. CUDA memory in a build without CUDA */
  MPIGRAD_ERROR_OUT_OF_MEMORY = 10,
  MPIGRAD_ERROR_RUNTIME = 11 /* anything else; the message says what */
} mpigrad_status;

typedef enum mpigrad_dtype {
  MPIGRAD_F32 = 0,
  MPIGRAD_F64 = 1,
  MPIGRAD_BF16 = 2,
  MPIGRAD_F16 = 3,
  MPIGRAD_I32 = 4, /* class labels */
  MPIGRAD_I64 = 5
} mpigrad_dtype;

typedef enum mpigrad_order {
  MPIGRAD_ORDER_C = 0,      /* row-major: the last dimension varies fastest */
  MPIGRAD_ORDER_FORTRAN = 1 /* column-major: the first dimension varies fastest */
} mpigrad_order;

typedef enum mpigrad_memory {
  MPIGRAD_MEMORY_HOST = 0,
  MPIGRAD_MEMORY_CUDA = 1 /* device memory of CUDA device `device`: ready to read, or ready
                            once the work queued before the call on its stream (the *_on_stream
                            calls) has run */
} mpigrad_memory;

typedef struct mpigrad_array {
  void* data;
  int32_t rank;                    /* 1 to MPIGRAD_MAX_RANK */
  int64_t shape[MPIGRAD_MAX_RANK]; /* in `order`: shape[0] is the batch in C order */
  const int64_t* strides;          /* in elements, in `order`; NULL: dense */
  mpigrad_dtype dtype;
  mpigrad_order order;
  mpigrad_memory memory;
  int32_t device; /* the CUDA device of MPIGRAD_MEMORY_CUDA data */
} mpigrad_array;

/* A dense host array of `rank` dimensions. */
static inline mpigrad_array mpigrad_host_array(void* data, int32_t rank, const int64_t* shape,
                                               mpigrad_dtype dtype, mpigrad_order order) {
  mpigrad_array array;
  int32_t d;
  array.data = data;
  array.rank = rank;
  for (d = 0; d < MPIGRAD_MAX_RANK; ++d) array.shape[d] = (d < rank && shape) ? shape[d] : 0;
  array.strides = 0;
  array.dtype = dtype;
  array.order = order;
  array.memory = MPIGRAD_MEMORY_HOST;
  array.device = 0;
  return array;
}

/* A model handle: an id that is never reused. The zero handle is no model. */
typedef struct mpigrad_model {
  uint64_t id;
} mpigrad_model;

/* A Fortran MPI communicator handle (MPI_Fint; MPI_Comm_c2f(comm) in C, comm%MPI_VAL from
 * mpi_f08, or the integer of `use mpi`). */
typedef int32_t mpigrad_fortran_comm;

/* "0.1.0". */
const char* mpigrad_version(void);

/* The message of this thread's last failed call ("" if none); valid until its next call. */
const char* mpigrad_last_error(void);
/* "MPIGRAD_ERROR_SHAPE", ... */
const char* mpigrad_status_name(mpigrad_status status);

/* Seeds the models this thread creates from now on (their initial weights and any dropout),
 * instead of their config's [train] seed. */
mpigrad_status mpigrad_set_seed(uint64_t seed);

/* `config`: INI text, or the path of an INI file. `device`: "cpu", "cuda" or "cuda:N". Needs
 * no MPI. */
mpigrad_status mpigrad_model_create(mpigrad_model* model, const char* config, const char* device);
/* Data-parallel over a duplicate of `comm`; MPI must be initialized by the host. `device` NULL
 * or "" picks this rank's (the GPU of its local rank when there are GPUs, else the CPU). */
mpigrad_status mpigrad_model_create_distributed(mpigrad_model* model, const char* config,
                                                mpigrad_fortran_comm comm, const char* device);
/* Frees the model and sets *model to the zero handle. Destroying the zero handle is a no-op.
 * Collective for a distributed model (see above). */
mpigrad_status mpigrad_model_destroy(mpigrad_model* model);

/* One training step on this rank's batch: with [train] grad_accum_steps = k (default 1), every
 * k-th call steps the optimizer. `loss` gets THIS RANK's loss, the mean over its own batch; may
 * be NULL: the step then does not wait for it (mpigrad_last_loss reads it later). Collective
 * for a distributed model. */
mpigrad_status mpigrad_train_step(mpigrad_model model, const mpigrad_array* input,
                                  const mpigrad_array* label, double* loss);
/* mpigrad_train_step queued on the caller's CUDA stream `stream` (a cudaStream_t; NULL: as
 * mpigrad_train_step): inputs and labels on the device may still be being written by work
 * queued on that stream before the call, and everything the step does on the model's device
 * is queued on it, after that work; nothing waits for the device, except reading the loss when
 * `loss` is not NULL, and [train] clip_grad_norm, which reads the gradient norm. With [train]
 * cuda_graphs the step runs on a stream of the model's instead, after the work queued on
 * `stream` and before the work queued on it later. The stream must stay alive while the model
 * may use it, until the model is destroyed. A stream for a model on the CPU is
 * MPIGRAD_ERROR_INVALID_ARGUMENT. */
mpigrad_status mpigrad_train_step_on_stream(mpigrad_model model, const mpigrad_array* input,
                                            const mpigrad_array* label, double* loss, void* stream);
/* This rank's loss of the model's last step (0 before the first). Local. */
mpigrad_status mpigrad_last_loss(mpigrad_model model, double* loss);
/* The last step's loss over the model's ranks: each rank's loss weighted by its batch, so the
 * loss of the whole global batch (TorchFort's). Collective (one all-reduce of two numbers, only
 * when called, so steps never wait for it); without MPI, mpigrad_last_loss. */
mpigrad_status mpigrad_mean_loss(mpigrad_model model, double* loss);

/* Called on every rank after each optimizer step, with the steps taken so far and the learning
 * rate that step used; user_data is passed through. It may call mpigrad_last_loss, or, on
 * every rank alike, mpigrad_mean_loss and mpigrad_save_checkpoint. */
typedef void (*mpigrad_step_callback)(mpigrad_model model, int64_t step, double lr,
                                      void* user_data);
/* Sets the model's step callback; NULL removes it. */
mpigrad_status mpigrad_set_step_callback(mpigrad_model model, mpigrad_step_callback callback,
                                         void* user_data);
/* The model's output for `input` in evaluation mode, written into `output`, which must hold
 * as many values per sample as the model outputs, for the same batch. */
mpigrad_status mpigrad_predict(mpigrad_model model, const mpigrad_array* input,
                               const mpigrad_array* output);
/* mpigrad_predict queued on the caller's CUDA stream, as mpigrad_train_step_on_stream: the
 * output is written when the work queued on `stream` by the call has run. */
mpigrad_status mpigrad_predict_on_stream(mpigrad_model model, const mpigrad_array* input,
                                         const mpigrad_array* output, void* stream);

/* Models of several inputs or outputs, as TorchFort's train_multiarg: an ONNX graph
 * ([model] name = onnx, file = ...). `inputs` holds n_inputs arrays, one per graph input in the
 * graph's order; `labels` n_labels arrays, one per graph output. Each array is checked as the
 * one-array calls check theirs (its sample shape the graph input's, or the output's; every
 * input the same batch), and a message names it as inputs[i] or labels[i], in the caller's
 * order. An integer graph input (token ids) takes an int32 or int64 array. The loss is the sum
 * over the outputs of [loss] name against their labels. A count that differs from the graph's,
 * or a built-in model, is an error. Collective for a distributed model. */
mpigrad_status mpigrad_train_step_multi(mpigrad_model model, int32_t n_inputs,
                                        const mpigrad_array* inputs, int32_t n_labels,
                                        const mpigrad_array* labels, double* loss);
/* The model's outputs for `inputs` in evaluation mode, written into `outputs` (n_outputs arrays,
 * one per graph output, each the inputs' batch of the output's sample shape). Local. */
mpigrad_status mpigrad_predict_multi(mpigrad_model model, int32_t n_inputs,
                                     const mpigrad_array* inputs, int32_t n_outputs,
                                     const mpigrad_array* outputs);
/* How many arrays the model takes and gives: its graph's inputs and outputs (1 and 1 for the
 * built-in models). Either pointer may be NULL. */
mpigrad_status mpigrad_model_arrays(mpigrad_model model, int32_t* n_inputs, int32_t* n_outputs);
/* Interatomic potentials: a model whose config has [loss] name = energy_force and [model] name =
 * schnet (hidden, n_rbf, interactions; the cutoff of [graph]) or an ONNX energy model
 * (docs/interatomic-potentials.md), for a host MD code that gets energies and forces from it and
 * trains it on labelled frames as it runs. [model] input_shape and outputs do not apply; [graph]
 * cutoff (and max_neighbors, self_loops) builds the neighbor list when the host gives none;
 * [loss] stress_weight must be 0 (no stress labels here). Such a model refuses the sample calls
 * above (mpigrad_train_step, mpigrad_predict, ...), and the calls below refuse any other model:
 * MPIGRAD_ERROR_CONFIG.
 *
 * A batch of B structures, V atoms in all, concatenated. Each field is an mpigrad_array; the
 * optional ones may be NULL. Shapes in C order (Fortran order reverses them: positions(3, V)):
 *   positions       [V, 3] float64 or float32 (MD codes' double is read as is and rounded to the
 *                   model's float32); x, y, z of an atom together
 *   atomic_numbers  [V] int32 or int64; 1 .. the model's largest (schnet: 100), else
 *                   MPIGRAD_ERROR_INVALID_ARGUMENT naming the atom
 *   num_atoms       [B] int32 or int64, atoms per structure, summing to V; NULL: one structure
 *   cell            [B, 3, 3] float (or [3, 3] for one structure): each structure's lattice
 *                   vectors as rows (in Fortran, cell(:, i) is vector i); NULL: no cell
 *   pbc             [B, 3] (or [3]) int32 or int64, nonzero: the axis is periodic; NULL: none
 *                   (a periodic axis needs a cell)
 *   edge_index      [2, E] int32 or int64: the host's own neighbor list, row 0 the sources, row 1
 *                   the targets (in Fortran order edge_index(E, 2): column 1 the sources),
 *                   atoms numbered from index_base, both atoms of an edge in one
 *                   structure; NULL: mpigrad builds the radius graph of [graph] cutoff (its
 *                   cell list, periodic images included). An edge is directed: list both (i, j)
 *                   and (j, i), as radius graphs do. A list with more pairs than the cutoff's (a
 *                   Verlet list with a skin) gives schnet's energy, whose filters vanish there.
 *   edge_shifts     [E, 3] float: each edge's Cartesian image offset, so that the edge's vector
 *                   is positions[target] - positions[source] + shift; NULL: zeros
 *   index_base      0 (C) or 1 (Fortran's atom numbers in edge_index)
 * Errors name the array ("positions: shape [64, 2]; expected [atoms, 3] ...") and, on a
 * distributed model, the rank whose array it was ("(rank 1 of 2)"). Arrays are read, never
 * kept: they may change after the call. */
typedef struct mpigrad_atoms {
  const mpigrad_array* positions;
  const mpigrad_array* atomic_numbers;
  const mpigrad_array* num_atoms;
  const mpigrad_array* cell;
  const mpigrad_array* pbc;
  const mpigrad_array* edge_index;
  const mpigrad_array* edge_shifts;
  int32_t index_base;
} mpigrad_atoms;

/* One structure of `positions` and `atomic_numbers`: no cell, mpigrad's neighbor list. */
static inline mpigrad_atoms mpigrad_atoms_of(const mpigrad_array* positions,
                                             const mpigrad_array* atomic_numbers) {
  mpigrad_atoms atoms;
  atoms.positions = positions;
  atoms.atomic_numbers = atomic_numbers;
  atoms.num_atoms = 0;
  atoms.cell = 0;
  atoms.pbc = 0;
  atoms.edge_index = 0;
  atoms.edge_shifts = 0;
  atoms.index_base = 0;
  return atoms;
}

/* Each structure's energy, written into `energy` ([B] or [B, 1], float64 or float32), and, unless
 * `forces` is NULL, the forces -dE/dpositions into `forces` ([V, 3], float64 or float32), from
 * the model in evaluation mode (float32 inside). Local: no other rank takes part. */
mpigrad_status mpigrad_atoms_predict(mpigrad_model model, const mpigrad_atoms* atoms,
                                     const mpigrad_array* energy, const mpigrad_array* forces);
/* One training step on this rank's labelled structures: `energy` [B] (or [B, 1]) and `forces`
 * [V, 3] (float64 or float32; forces may be NULL only when [loss] force_weight weighs no forces),
 * through the step of `mpigrad train`'s energy_force (forces by a double backward; the [loss]
 * weights, kind and per_atom_energy) and the same training path: DDP's gradient average over the
 * model's ranks, grad_accum_steps, clip_grad_norm, the optimizer and [sched]. Every term is a mean
 * over the structures of all ranks together, so ranks may hold different numbers of structures.
 * Collective for a distributed model: the ranks first agree (one all-reduce) that every rank's
 * arrays fit, so a bad array on one rank returns its error on every rank rather than leaving
 * them waiting (a NULL pointer or a malformed mpigrad_array is found before that, on its rank
 * alone). `loss` (may be NULL) gets this rank's part of the loss of all ranks' structures:
 * mpigrad_mean_loss, the mean of the ranks' parts, is the loss of the global batch. */
mpigrad_status mpigrad_atoms_train_step(mpigrad_model model, const mpigrad_atoms* atoms,
                                        const mpigrad_array* energy, const mpigrad_array* forces,
                                        double* loss);

/* The weights, as an HDF5 checkpoint torch can load (/model/<name>). */
mpigrad_status mpigrad_save_model(mpigrad_model model, const char* path);
mpigrad_status mpigrad_load_model(mpigrad_model model, const char* path);
/* Weights, optimizer, scheduler, RNG and step, for restarting. */
mpigrad_status mpigrad_save_checkpoint(mpigrad_model model, const char* path);
mpigrad_status mpigrad_load_checkpoint(mpigrad_model model, const char* path);

/* Optimizer steps taken (restored by mpigrad_load_checkpoint). */
mpigrad_status mpigrad_steps(mpigrad_model model, int64_t* steps);
/* Bytes of float32 inputs and labels (int64 cross_entropy classes) that mpigrad made because
 * the caller's were not dense float32 in the model's memory: converted, gathered or moved. */
mpigrad_status mpigrad_copied_bytes(mpigrad_model model, int64_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPIGRAD_C_H */
