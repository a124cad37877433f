// DistributedDataParallel and SyncBatchNorm with the model on the GPU and the NCCL communicator,
// checked against the same model and data on the host over MPI (shared memory off, so the host
// side is the plain all-reduce path): the model check, the bucket all-reduces, the join flag and
// SyncBatchNorm's statistics all travel over NCCL. Runs only where every rank has its own GPU.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../../tensor_difference.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/launch/ddp/distributed_data_parallel.h"
#include "mpigrad/launch/ddp/sync_batch_norm.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/loss.h"
#include "nccl_test.h"

using namespace mpigrad;
using core::Tensor;
using mpigrad::test::max_difference;

namespace {

std::shared_ptr<nn::Sequential> make_model() {
  core::Generator generator(17);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 32, generator), std::make_shared<nn::BatchNorm1d>(32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 4, generator)});
}

}  // namespace

MPIGRAD_NCCL_TEST_CASE("DDP with SyncBatchNorm on the GPU over NCCL matches the host over MPI") {
  auto manager = launch::DistributedManager::initialize();
  const core::Device gpu = core::cuda(manager.local_rank() % core::cuda_device_count());
  auto nccl = launch::create_communicator(manager, launch::Backend::Nccl, gpu, "ddp-nccl");
  auto mpi = launch::create_communicator(manager, launch::Backend::Mpi, core::kCPU, "ddp-mpi");
  REQUIRE(nccl->device() == gpu);
  REQUIRE(mpi->device() == core::kCPU);

  auto on_gpu = make_model(), on_host = make_model();
  on_gpu->to(gpu);
  launch::convert_sync_batchnorm(*on_gpu, *nccl);
  launch::convert_sync_batchnorm(*on_host, *mpi);
  launch::DdpOptions host_options;
  host_options.shared_memory = false;
  host_options.first_bucket_cap_mb = 0.0001;  // several buckets in flight during backward
  host_options.bucket_cap_mb = 0.0001;
  launch::DdpOptions gpu_options = host_options;
  launch::DistributedDataParallel ddp_gpu(*on_gpu, *nccl, gpu_options);
  launch::DistributedDataParallel ddp_host(*on_host, *mpi, host_options);
  CHECK(ddp_gpu.transport_kind() == launch::TransportKind::Communicator);
  CHECK(ddp_gpu.bucket_count() == ddp_host.bucket_count());

  for (int step = 0; step < 3; ++step) {
    core::Generator data(100 + uint64_t(manager.rank()) * 10 + uint64_t(step));
    Tensor x = core::randn({6, 8}, data), y = core::randn({6, 4}, data);
    on_gpu->zero_grad();
    on_host->zero_grad();
    nn::mse_loss(ddp_gpu(x.to(gpu)), y.to(gpu)).backward();
    nn::mse_loss(ddp_host(x), y).backward();
    auto named_gpu = on_gpu->named_parameters(), named_host = on_host->named_parameters();
    for (size_t i = 0; i < named_gpu.size(); ++i) {
      INFO(named_gpu[i].first << " step " << step);
      CHECK(max_difference(named_gpu[i].second.grad(), named_host[i].second.grad()) <= 1e-5);
    }
    auto buffers_gpu = on_gpu->named_buffers(), buffers_host = on_host->named_buffers();
    for (size_t i = 0; i < buffers_gpu.size(); ++i) {
      INFO(buffers_gpu[i].first << " step " << step);
      CHECK(max_difference(buffers_gpu[i].second, buffers_host[i].second) <= 1e-5);
    }
  }
  // The join flag of uneven inputs travels over NCCL too.
  CHECK(ddp_gpu.ranks_with_data(manager.rank() == 0) == 1);
}
