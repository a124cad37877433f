#!/usr/bin/env bash
# The main job from a fresh Debian machine: install dependencies, build, convert Debian's
# Fashion-MNIST (dataset-fashion-mnist) into HDF5 shards, and train the CNN on 2 ranks with
# mpirun. Extra arguments go to `mpigrad train`, e.g. scripts/main.sh --train.epochs=1, or
# MPIGRAD_CONFIG=examples/fashion_mnist_mlp.ini scripts/main.sh for the MLP.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build_dir=${MPIGRAD_BUILD_DIR:-build}
mpigrad="$build_dir/bin/mpigrad"

# The example configs read their shards from here (paths relative to the repository root).
data_dir=build/datasets/fashion-mnist
source_dir=/usr/share/datasets/fashion-mnist
if [ ! -f "$data_dir/test.h5" ]; then
  mkdir -p "$data_dir"
  "$mpigrad" data convert-idx --images "$source_dir/train-images-idx3-ubyte.gz" \
    --labels "$source_dir/train-labels-idx1-ubyte.gz" --output "$data_dir/train.h5" --shards 2
  "$mpigrad" data convert-idx --images "$source_dir/t10k-images-idx3-ubyte.gz" \
    --labels "$source_dir/t10k-labels-idx1-ubyte.gz" --output "$data_dir/test.h5"
fi

# Debian's OpenBLAS may not recognise newer AVX-512 CPUs; name the kernel family for it.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
# Open MPI refuses root unless told otherwise (containers and CI run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -np 2 --oversubscribe "$mpigrad" train \
  --config "${MPIGRAD_CONFIG:-examples/fashion_mnist_cnn.ini}" "$@"
