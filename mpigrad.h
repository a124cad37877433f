// The public API of mpigrad in one include: #include <mpigrad/mpigrad.h>.
//
// Each line names the concepts a header defines; include that header alone to compile less.
#pragma once

#include "mpigrad/core/autograd.h"        // defines: backward, NoGradGuard, Node, grad-ready hooks
#include "mpigrad/core/device.h"          // defines: Device, kCPU, cuda()
#include "mpigrad/core/dtype.h"           // defines: DType, kFloat32 ... kBool, promote_types
#include "mpigrad/core/error.h"           // defines: Error, MPIGRAD_CHECK
#include "mpigrad/core/ops/elementwise.h" // defines: add ... tanh, where, comparisons, operators
#include "mpigrad/core/ops/indexing.h"    // defines: index_select, gather, one_hot, embedding
#include "mpigrad/core/ops/join.h"        // defines: cat, stack
#include "mpigrad/core/ops/linalg.h"      // defines: matmul
#include "mpigrad/core/ops/reduce.h"      // defines: sum, mean, var, max, min, argmax
#include "mpigrad/core/ops/softmax.h"     // defines: softmax, log_softmax
#include "mpigrad/core/rng.h"             // defines: Generator, rand, randn, bernoulli
#include "mpigrad/core/tensor.h"          // defines: Tensor, TensorOptions, zeros, ones, arange
#include "mpigrad/core/threads.h"         // defines: num_threads, set_num_threads
#include "mpigrad/version.h"              // defines: MPIGRAD_VERSION
