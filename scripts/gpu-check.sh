#!/usr/bin/env bash
# The GPU check, first half: on a machine without a GPU, build Release with CUDA for sm_90 and pack
# into one folder everything a bare GPU machine needs to run the GPU tests, the kernel benchmark
# and the Fashion-MNIST main job, with the second half, run.sh (scripts/gpu-check-run.sh):
#
#   scripts/gpu-check.sh --bundle DIR [--build-dir BUILD] [--no-build]
#   DIR/run.sh OUTDIR                      # on the GPU machine: logs and summary.json in OUTDIR
#
# The folder holds the mpigrad program, the GPU test suites, the kernel and embedding benchmarks,
# every shared library they load except glibc, libstdc++/libgcc_s and the CUDA, cuDNN and NCCL
# libraries (run.sh finds those on the GPU machine), Open MPI's programs, components, help and
# configuration files and PMIx's (run.sh points OPAL_*/PMIX_* at them, so mpirun needs no Open MPI
# installed there), the converted Fashion-MNIST HDF5 files, the example config, the PyTorch
# comparison script and the zoo's GPU arm (benchmarks/zoo/gpu_arm.py and the zoo modules it uses). Every copied ELF file loses its RPATH, so nothing in it can reach back to
# this machine's build tree. The script fails if `ldd`, with DIR/lib and this machine's CUDA
# libraries on the library path, finds anything missing, or if DIR packs (DIR.tar.xz, written
# beside it: the file to carry to the GPU machine) to more than 60 MiB.
#
# BUILD defaults to $MPIGRAD_BUILD_DIR or build/, the folder scripts/build.sh and CI use, so the
# CI build is reused: configured with the same options it only relinks what changed. --no-build
# packs an existing build as it is (used by the bundle test inside ctest, which must not build).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bundle=""
build_dir=${MPIGRAD_BUILD_DIR:-build}
build=1
max_pack_bytes=$((60 * 1024 * 1024))

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
fail() {
  echo "gpu-check: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) [ $# -ge 2 ] || usage; bundle=$2; shift 2 ;;
    --build-dir) [ $# -ge 2 ] || usage; build_dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h | --help) usage ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$bundle" ] || usage
case "$build_dir" in /*) ;; *) build_dir=$repo/$build_dir ;; esac
case "$bundle" in /*) ;; *) bundle=$PWD/$bundle ;; esac
bundle=${bundle%/}
[ "$bundle" != "/" ] && [ "$bundle" != "$repo" ] || fail "refusing to use $bundle as the bundle"

# ---- 1. The build: Release, CUDA, sm_90 -------------------------------------------------------
if [ "$build" -eq 1 ]; then
  "$repo/scripts/install-deps.sh"
  cmake -S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMPIGRAD_WERROR=ON \
    -DMPIGRAD_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$build_dir" --parallel "$(nproc)"
fi
cache=$build_dir/CMakeCache.txt
[ -f "$cache" ] || fail "no build in $build_dir (run without --no-build)"
grep -Eqx 'CMAKE_BUILD_TYPE:[A-Z]*=Release' "$cache" || fail "$build_dir is not a Release build"
grep -Eqx 'CMAKE_CUDA_ARCHITECTURES:[A-Z]*=90' "$cache" ||
  fail "$build_dir is not built for sm_90 (CMAKE_CUDA_ARCHITECTURES=90)"
programs=(
  "bin/mpigrad"
  "tests/cuda/mpigrad-test-cuda"
  "tests/nn_cuda/mpigrad-test-nn-cuda"
  "tests/comm/nccl/mpigrad-test-nccl"
  "benchmarks/kernels/mpigrad-bench-kernels"
  "benchmarks/embed/mpigrad-bench-embed"
)
for program in "${programs[@]}"; do
  [ -x "$build_dir/$program" ] || fail "$build_dir/$program is missing: build it first"
done
# (Not grep -q: under pipefail its early exit would fail ldd with SIGPIPE now and then.)
ldd "$build_dir/bin/mpigrad" | grep 'libcudart\.so' > /dev/null ||
  fail "$build_dir is built without CUDA (libmpigrad does not link libcudart)"

# ---- 2. The Fashion-MNIST HDF5 files (converted as scripts/main.sh does) ----------------------
data_dir=$repo/build/datasets/fashion-mnist
source_dir=/usr/share/datasets/fashion-mnist
data_files=(train-00000-of-00002.h5 train-00001-of-00002.h5 test.h5)
if [ ! -f "$data_dir/test.h5" ] || [ ! -f "$data_dir/train-00001-of-00002.h5" ]; then
  [ -d "$source_dir" ] || fail "no Fashion-MNIST in $source_dir (Debian's dataset-fashion-mnist)"
  mkdir -p "$data_dir"
  "$build_dir/bin/mpigrad" data convert-idx --images "$source_dir/train-images-idx3-ubyte.gz" \
    --labels "$source_dir/train-labels-idx1-ubyte.gz" --output "$data_dir/train.h5" --shards 2
  "$build_dir/bin/mpigrad" data convert-idx --images "$source_dir/t10k-images-idx3-ubyte.gz" \
    --labels "$source_dir/t10k-labels-idx1-ubyte.gz" --output "$data_dir/test.h5"
fi

# ---- 3. The folder --------------------------------------------------------------------------
rm -rf "$bundle" "$bundle.tar.gz" "$bundle.tar.xz"
mkdir -p "$bundle"/{bin,lib/openmpi,lib/pmix,share,etc,data/fashion-mnist,examples,benchmarks/zoo}
for program in "${programs[@]}"; do cp -L "$build_dir/$program" "$bundle/bin/"; done
for file in "${data_files[@]}"; do cp "$data_dir/$file" "$bundle/data/fashion-mnist/"; done
cp "$repo/examples/fashion_mnist_cnn.ini" "$bundle/examples/"
cp "$repo/examples/fashion_mnist_onnx.ini" "$repo/tests/data/onnx/fashion_cnn.legacy.onnx" \
  "$bundle/examples/"
cp "$repo/benchmarks/gpu_check/torch_fashion_mnist.py" "$bundle/benchmarks/"
# The zoo's GPU arm (it exports its models on the GPU machine, so no ONNX file travels).
cp "$repo"/benchmarks/zoo/{gpu_arm,zoo_models,export_models,run_zoo}.py "$bundle/benchmarks/zoo/"
cp "$repo/scripts/gpu-check-run.sh" "$bundle/run.sh"
chmod +x "$bundle/run.sh"

# Open MPI: mpirun (orterun) and orted (it starts one for a singleton MPI_Init), its components
# without the network transports whose libraries a single GPU node does not need (UCX,
# libfabric, verbs, PSM) and without OpenSHMEM's, its help texts (every error Open MPI prints
# comes from them) and its configuration files.
mpirun_path=$(readlink -f "$(command -v mpirun)") || fail "no mpirun (Debian's openmpi-bin)"
ompi_bin=$(dirname "$mpirun_path")
cp -L "$mpirun_path" "$bundle/bin/orterun"
cp -L "$ompi_bin/orted" "$bundle/bin/orted"
ln -s orterun "$bundle/bin/mpirun"
ln -s orterun "$bundle/bin/mpiexec"
ompi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
ompi_pkglibdir=$(ompi_path pkglibdir)
ompi_pkgdatadir=$(ompi_path pkgdatadir)
ompi_sysconfdir=$(ompi_path sysconfdir)
for component in "$ompi_pkglibdir"/mca_*.so; do
  case "$(basename "$component")" in
    *ucx* | *ofi* | *openib* | *psm* | *verbs* | mca_atomic_* | mca_memheap_* | mca_scoll_* | \
      mca_spml_* | mca_sshmem_*) continue ;;
  esac
  cp -L "$component" "$bundle/lib/openmpi/"
done
cp -r "$ompi_pkgdatadir" "$bundle/share/openmpi"
cp -r "$ompi_sysconfdir" "$bundle/etc/openmpi"
# PMIx, which Debian's Open MPI uses as an external library: its few components and its files.
pmix_lib=$(ldd "$ompi_pkglibdir/mca_pmix_ext3x.so" | awk '$1 ~ /^libpmix\.so/ {print $3}')
[ -n "$pmix_lib" ] || fail "cannot find libpmix from Open MPI's mca_pmix_ext3x.so"
pmix_prefix=$(cd "$(dirname "$(readlink -f "$pmix_lib")")/.." && pwd)
if [ -d "$pmix_prefix/lib/pmix" ]; then cp -L "$pmix_prefix"/lib/pmix/*.so "$bundle/lib/pmix/"; fi
if [ -d "$pmix_prefix/share/pmix" ]; then cp -r "$pmix_prefix/share/pmix" "$bundle/share/pmix"; fi
if [ -f "$pmix_prefix/share/pmix-mca-params.conf" ]; then
  cp "$pmix_prefix/share/pmix-mca-params.conf" "$bundle/etc/"
fi

# ---- 4. Shared libraries: the closure of everything above -----------------------------------
# Left to the GPU machine: glibc, the C++ runtime, and what its CUDA/cuDNN/NCCL installation
# provides (run.sh finds those and checks each one needed is there).
provided_there() {
  case "$1" in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.* | libm.so.* | libmvec.so.* | \
      libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | \
      libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libcudnn*.so.* | \
      libnccl.so.* | libnvrtc*.so.* | libnvJitLink.so.*) return 0 ;;
  esac
  return 1
}
is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }
elf_files() {
  for file in "$bundle"/bin/* "$bundle"/lib/*.so* "$bundle"/lib/openmpi/*.so \
    "$bundle"/lib/pmix/*.so; do
    [ -L "$file" ] || ! is_elf "$file" || echo "$file"
  done
}
# The CUDA libraries of this machine, so that ldd resolves (and checks) the ones left out.
cuda_lib_dirs=$(ldd "$build_dir/bin/mpigrad" |
  awk '$1 ~ /^lib(cudart|cublas|cublasLt|cudnn|nccl)\.so/ {print $3}' | xargs -r -n1 dirname |
  sort -u | paste -sd:)
lookup_path="$bundle/lib:$cuda_lib_dirs"
added=1
while [ "$added" -eq 1 ]; do
  added=0
  while read -r file; do
    while read -r name _ path _; do
      [ -n "$name" ] || continue
      provided_there "$name" && continue
      [ -e "$bundle/lib/$name" ] && continue
      [ -n "$path" ] && [ "$path" != "not" ] && [ -e "$path" ] || continue  # reported below
      cp -L "$path" "$bundle/lib/$name"
      added=1
    done < <(LD_LIBRARY_PATH=$lookup_path ldd "$file" 2>/dev/null | grep '=>' || true)
  done < <(elf_files)
done

# ---- 5. No RPATH pointing back here; strip symbols the programs do not need ------------------
rpath_script=$(mktemp --suffix=.cmake)
trap 'rm -f "$rpath_script"' EXIT
{
  while read -r file; do echo "file(RPATH_REMOVE FILE \"$file\")"; done < <(elf_files)
} >"$rpath_script"
cmake -P "$rpath_script" >/dev/null || fail "removing the RPATHs of the bundle's files failed"
if command -v strip >/dev/null; then
  while read -r file; do strip --strip-unneeded "$file" 2>/dev/null || true; done < <(elf_files)
fi

# ---- 6. The manifest run.sh checks the GPU machine against ----------------------------------
max_version() { tr ' ' '\n' | grep -E "^$1[0-9.]+$" | sed "s/^$1//" | sort -V | tail -1; }
glibc_needed=$(elf_files | xargs -r objdump -T 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' |
  max_version GLIBC_)
glibcxx_needed=$(elf_files | xargs -r objdump -T 2>/dev/null | grep -oE 'GLIBCXX_[0-9.]+' |
  max_version GLIBCXX_)
# The CUDA libraries the bundle loads, directly or through each other (libcublas needs
# libcublasLt): what run.sh must find on the GPU machine.
cuda_sonames=$(elf_files | while read -r file; do
  LD_LIBRARY_PATH=$lookup_path ldd "$file" 2>/dev/null | awk '/=>/ {print $1}'
done | sort -u | grep -E '^lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink)\.so' |
  paste -sd' ')
nvcc_release=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")$/\1/p' \
  "$build_dir"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | tail -1)
commit=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD -- 2>/dev/null || commit="$commit+changes"
cat >"$bundle/manifest.sh" <<EOF
# Written by scripts/gpu-check.sh; read by run.sh.
bundle_commit="$commit"
bundle_built="$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
bundle_nvcc="$nvcc_release"
bundle_cuda_architectures="90"
bundle_glibc_needed="$glibc_needed"
bundle_glibcxx_needed="$glibcxx_needed"
bundle_cuda_sonames="$cuda_sonames"
bundle_programs="$(for program in "${programs[@]}"; do basename "$program"; done | paste -sd' ')"
EOF

# ---- 7. Checks: nothing missing, and small enough to carry ----------------------------------
missing=$(elf_files | while read -r file; do
  LD_LIBRARY_PATH=$lookup_path ldd "$file" 2>&1 | grep 'not found' | sed "s|^|${file#"$bundle"/}: |"
done || true)
[ -z "$missing" ] || fail "libraries not found with $bundle/lib on the library path:
$missing"
# xz, not gzip: oneDNN alone is 11 MiB gzipped, 7 xz'd, and the carry limit is tight. The GPU
# machine unpacks it with python3's tarfile (docs/gpu.md), which needs no xz program there.
XZ_OPT="-6 -T0" tar -C "$(dirname "$bundle")" -cJf "$bundle.tar.xz" "$(basename "$bundle")"
packed=$(stat -c %s "$bundle.tar.xz")
[ "$packed" -le "$max_pack_bytes" ] ||
  fail "$bundle packs to $packed bytes ($bundle.tar.xz), over the 60 MiB limit"
echo "gpu-check: bundle $bundle ready ($(du -sh "$bundle" | cut -f1) on disk, $bundle.tar.xz" \
  "$((packed / 1024 / 1024)) MiB; commit $commit); on the GPU machine run:" \
  "$(basename "$bundle")/run.sh OUTDIR"
