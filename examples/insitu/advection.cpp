// The in-situ advection example of advection.f90, in C++ over the C++ API (EmbeddedModel): the
// same slab-decomposed "simulation", the same MPI_Alltoallv redistribution of each batch of 16
// samples to the training ranks, the same validation on 100 fresh samples.
//
//   mpirun -np 4 advection_cpp CONFIG [--steps N] [--train-ranks T] [--check MAX_ERROR]
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/launch/comm/rank_label.h"
#include "mpigrad/launch/insitu/embedded_model.h"
#include "mpigrad/launch/mpi_interop.h"

namespace {

constexpr int kGrid = 32, kBatch = 16, kValidation = 100;
constexpr double kAx = 1.0, kAy = 0.5, kDt = 0.01;
const double kPi = std::acos(-1.0);

struct Slab {
  int begin = 0, rows = 0;  // grid rows (y) begin .. begin + rows - 1, 0-based
};

Slab slab_of(int rank, int size) {
  return {rank * kGrid / size, (rank + 1) * kGrid / size - rank * kGrid / size};
}

// This rank's rows of sample `sample`: u and its divergence, x fastest.
void simulate(int sample, Slab slab, float* u, float* divergence) {
  const double t = sample * kDt;
  for (int iy = 0; iy < slab.rows; ++iy) {
    const double y = -1 + 2.0 * (slab.begin + iy) / kGrid;
    for (int ix = 0; ix < kGrid; ++ix) {
      const double x = -1 + 2.0 * ix / kGrid;
      const double sx = std::sin(kPi * (x - kAx * t)), cx = std::cos(kPi * (x - kAx * t));
      const double sy = std::sin(kPi * (y - kAy * t)), cy = std::cos(kPi * (y - kAy * t));
      u[iy * kGrid + ix] = float(sx * sy);
      divergence[iy * kGrid + ix] = float(kPi * (kAx * cx * sy + kAy * sx * cy));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  namespace core = mpigrad::core;
  namespace launch = mpigrad::launch;
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 2) {
    if (rank == 0) {
      std::fprintf(stderr, "usage: %s CONFIG [--steps N] [--train-ranks T] [--check E]\n", argv[0]);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int steps = 1000, train_ranks = size;
  double max_error = -1;
  for (int k = 2; k + 1 < argc; k += 2) {
    const std::string flag = argv[k];
    if (flag == "--steps")
      steps = std::atoi(argv[k + 1]);
    else if (flag == "--train-ranks")
      train_ranks = std::atoi(argv[k + 1]);
    else if (flag == "--check")
      max_error = std::atof(argv[k + 1]);
  }
  if (train_ranks < 1 || train_ranks > size || kBatch % train_ranks != 0) {
    if (rank == 0) std::fprintf(stderr, "--train-ranks must divide 16 and be at most %d\n", size);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const bool trains = rank < train_ranks;
  const int local = kBatch / train_ranks;
  MPI_Comm training;
  MPI_Comm_split(MPI_COMM_WORLD, trains ? 0 : MPI_UNDEFINED, rank, &training);

  std::optional<launch::EmbeddedModel> model;
  if (trains) {
    try {
      model.emplace(argv[1], launch::adopt_communicator(training), core::kCPU);
    } catch (const std::exception& error) {
      launch::print_rank_error(rank, size, "advection", error.what());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  const Slab mine = slab_of(rank, size);
  const int cells = mine.rows * kGrid;
  std::vector<float> u(static_cast<size_t>(cells)), divergence(static_cast<size_t>(cells));
  double first_loss = -1, last_losses = 0;
  for (int step = 1; step <= steps; ++step) {
    // Outgoing, grouped by the training rank that owns each sample (sample s: rank s % T).
    std::vector<float> outgoing;
    std::vector<int> send_counts(size_t(size), 0), send_offsets(size_t(size), 0);
    for (int owner = 0; owner < train_ranks; ++owner) {
      send_offsets[size_t(owner)] = int(outgoing.size());
      for (int s = owner; s < kBatch; s += train_ranks) {
        simulate((step - 1) * kBatch + s, mine, u.data(), divergence.data());
        outgoing.insert(outgoing.end(), u.begin(), u.end());
        outgoing.insert(outgoing.end(), divergence.begin(), divergence.end());
      }
      send_counts[size_t(owner)] = int(outgoing.size()) - send_offsets[size_t(owner)];
    }
    for (int r = train_ranks; r < size; ++r) send_offsets[size_t(r)] = int(outgoing.size());
    std::vector<int> receive_counts(size_t(size), 0), receive_offsets(size_t(size), 0);
    int incoming_size = 0;
    if (trains) {
      for (int q = 0; q < size; ++q) {
        receive_offsets[size_t(q)] = incoming_size;
        receive_counts[size_t(q)] = 2 * kGrid * slab_of(q, size).rows * local;
        incoming_size += receive_counts[size_t(q)];
      }
    }
    std::vector<float> incoming(size_t(std::max(incoming_size, 1)));
    MPI_Alltoallv(outgoing.data(), send_counts.data(), send_offsets.data(), MPI_FLOAT,
                  incoming.data(), receive_counts.data(), receive_offsets.data(), MPI_FLOAT,
                  MPI_COMM_WORLD);
    if (!trains) continue;
    // Whole fields [local, 1, 32, 32] (C order: x fastest, as the slabs are).
    core::Tensor fields_u = core::zeros({local, 1, kGrid, kGrid});
    core::Tensor fields_div = core::zeros({local, 1, kGrid, kGrid});
    for (int q = 0; q < size; ++q) {
      const Slab theirs = slab_of(q, size);
      const float* from = incoming.data() + receive_offsets[size_t(q)];
      for (int k = 0; k < local; ++k) {
        const size_t n = size_t(theirs.rows) * kGrid,
                     at = size_t(k) * kGrid * kGrid + size_t(theirs.begin) * kGrid;
        std::copy(from, from + n, fields_u.data<float>() + at);
        std::copy(from + n, from + 2 * n, fields_div.data<float>() + at);
        from += 2 * n;
      }
    }
    const double loss = model->train_step(fields_u, fields_div).item<double>();
    if (step == 1) first_loss = loss;
    if (step > steps - 10) last_losses += loss / 10;
    if (rank == 0 && step % std::max(1, steps / 10) == 0) {
      std::printf("step %6d  loss %.4e\n", step, loss);
    }
  }

  // Validation: 100 fresh samples gathered on rank 0.
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) {
    counts[size_t(q)] = slab_of(q, size).rows * kGrid;
    offsets[size_t(q)] = slab_of(q, size).begin * kGrid;
  }
  core::Tensor whole_u = core::zeros({kValidation, 1, kGrid, kGrid});
  core::Tensor whole_div = core::zeros({kValidation, 1, kGrid, kGrid});
  for (int k = 0; k < kValidation; ++k) {
    simulate(steps * kBatch + k, mine, u.data(), divergence.data());
    MPI_Gatherv(u.data(), cells, MPI_FLOAT, whole_u.data<float>() + k * kGrid * kGrid,
                counts.data(), offsets.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(divergence.data(), cells, MPI_FLOAT, whole_div.data<float>() + k * kGrid * kGrid,
                counts.data(), offsets.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  int passed = 1;
  if (rank == 0) {
    const std::vector<float> predicted = model->predict(whole_u).to_vector<float>();
    const std::vector<float> truth = whole_div.to_vector<float>();
    double difference = 0, norm = 0;
    for (size_t i = 0; i < truth.size(); ++i) {
      difference += double(predicted[i] - truth[i]) * double(predicted[i] - truth[i]);
      norm += double(truth[i]) * double(truth[i]);
    }
    const double error = std::sqrt(difference / norm);
    std::printf("loss: first %.4e, mean of the last 10 %.4e\n", first_loss, last_losses);
    std::printf(
        "validation: relative L2 error of the predicted divergence %.4e (%d fresh "
        "samples)\n",
        error, kValidation);
    if (max_error > 0) passed = error < max_error && last_losses < 0.5 * first_loss;
  }
  MPI_Bcast(&passed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  model.reset();  // collective over the training ranks
  if (training != MPI_COMM_NULL) MPI_Comm_free(&training);
  int ranks = 0, one = 1;
  MPI_Allreduce(&one, &ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);  // the host's MPI still works
  MPI_Finalize();
  return passed && ranks == size ? 0 : 1;
}
