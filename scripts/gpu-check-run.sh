#!/usr/bin/env bash
# The GPU check, second half: DIR/run.sh OUTDIR, on a GPU machine, in a bundle that
# scripts/gpu-check.sh made (this file is copied there as run.sh).
#
# Setup, quietly (OUTDIR/setup.log): find CUDA, cuDNN and NCCL (under /usr/local/cuda, or in the
# site-packages/nvidia/*/lib of a python3 there) and the driver; check glibc, libstdc++ and that
# every program and library of the bundle resolves; point Open MPI and PMIx at the bundle
# (OPAL_*, PMIX_*: no Open MPI needs to be installed); run the main job's config for one step on
# 2 CPU ranks under the bundle's mpirun; then ask `mpigrad devices` for the GPU. Without one, it
# stops there with one line saying why, quoting the CUDA error, and exit status 2.
# With a GPU, each step runs under its own timeout, a failing step never stops the next, and the
# whole run stays under 9 minutes: the CUDA, nn CUDA and NCCL test suites with
# MPIGRAD_REQUIRE_GPU=1 (a skip is a failure), the kernel benchmark (bandwidth as a fraction of a
# device-to-device copy, GEMM against cuBLAS in fp32, bf16 and fp16), an embedded model's step
# replayed from a CUDA graph against the same step run as usual (the time ratio), the main job's
# CNN loaded from ONNX for one epoch on cuda:0, the main job's
# Fashion-MNIST CNN for 3 epochs on cuda:0 (test accuracy, samples/s), the same CNN for one epoch
# each in fp32, bf16 and fp16 (autocast: cuBLAS and cuDNN in 16 bits; samples/s against fp32),
# and the same model, batch and optimizer in PyTorch eager, eager under torch.autocast in bf16
# and fp16 (GradScaler for fp16), and torch.compile; then the zoo's GPU arm
# (benchmarks/zoo/gpu_arm.py: ResNet-18 and a GPT-2 decoder, exported there, PyTorch eager against
# mpigrad train on the GPU, OUTDIR/zoo.json). Every step's log and OUTDIR/summary.json
# (rewritten after each step, so a run cut short still leaves one) end up in OUTDIR.
# Exit status: 0 all passed, 1 something failed, 2 no GPU visible.
set -uo pipefail

bundle=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
if [ $# -ne 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
mkdir -p "$1" || exit 1
out=$(cd "$1" && pwd)
start=$(date +%s)
budget=530  # seconds for the whole run; each step's timeout is capped by what is left
setup_log=$out/setup.log
: >"$setup_log"
# shellcheck source=/dev/null
. "$bundle/manifest.sh"
data=$bundle/data/fashion-mnist

log() { printf '%s\n' "$*" >>"$setup_log"; }
elapsed() { echo $(($(date +%s) - start)); }

# ---- summary.json ---------------------------------------------------------------------------
json_string() {
  local s
  s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/}
  printf '"%s"' "$s"
}
json_number() {  # a number, or null
  if [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
    printf '%s' "$1"
  else
    printf null
  fi
}
json_file() {  # the JSON object in a file, or null
  if [ -s "$1" ] && [ "$(head -c 1 "$1")" = "{" ]; then cat "$1"; else printf null; fi
}
status="running"
status_line=""
setup_problems=()
steps_json=()
devices_text=""
lib_dirs_text=""
train_accuracy=""
train_rate=""
# Autocast: one epoch per precision, "samples/s accuracy" each (amp_rate fp32 etc.).
declare -A amp_rate=() amp_accuracy=()
write_summary() {
  local steps="" step problems="" problem
  for step in "${steps_json[@]}"; do steps+="${steps:+,}$step"; done
  for problem in "${setup_problems[@]}"; do
    problems+="${problems:+,}$(json_string "$problem")"
  done
  local torch_eager torch_compile
  torch_eager=$(sed -n 's/.*"eager_samples_per_s": *\([0-9.eE+-]*\).*/\1/p' \
    "$out/torch.json" 2>/dev/null | head -1)
  torch_compile=$(sed -n 's/.*"compile_samples_per_s": *\([0-9.eE+-]*\).*/\1/p' \
    "$out/torch.json" 2>/dev/null | head -1)
  ratio() {
    [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.4f", a / b}'
  }
  local eager_ratio compile_ratio
  eager_ratio=$(ratio "$train_rate" "$torch_eager")
  compile_ratio=$(ratio "$train_rate" "$torch_compile")
  # Autocast: each precision's samples/s over fp32's (same length of run), and over torch's
  # eager run in the same precision (fp32: plain eager; bf16, fp16: eager under torch.autocast).
  local amp="" precision torch_rate torch_key
  for precision in fp32 bf16 fp16; do
    torch_key=amp_${precision}_samples_per_s
    [ "$precision" = fp32 ] && torch_key=eager_samples_per_s
    torch_rate=$(sed -n "s/.*\"$torch_key\": *\([0-9.eE+-]*\).*/\1/;T;p;q" "$out/torch.json" \
      2>/dev/null)
    amp+="${amp:+,
          }\"$precision\": {\"samples_per_s\": $(json_number "${amp_rate[$precision]:-}"),"
    amp+=" \"test_accuracy\": $(json_number "${amp_accuracy[$precision]:-}"),"
    local rate=${amp_rate[$precision]:-}
    amp+=" \"vs_fp32\": $(json_number "$(ratio "$rate" "${amp_rate[fp32]:-}")"),"
    amp+=" \"torch_samples_per_s\": $(json_number "$torch_rate"),"
    amp+=" \"mpigrad_vs_torch\": $(json_number "$(ratio "$rate" "$torch_rate")")}"
  done
  cat >"$out/summary.json.tmp" <<EOF
{
  "status": $(json_string "$status"),
  "message": $(json_string "$status_line"),
  "seconds": $(elapsed),
  "bundle": {"commit": $(json_string "$bundle_commit"), "built": $(json_string "$bundle_built"),
             "nvcc": $(json_string "$bundle_nvcc"),
             "cuda_architectures": $(json_string "$bundle_cuda_architectures")},
  "machine": {"devices": $(json_string "$devices_text"),
              "library_dirs": $(json_string "$lib_dirs_text"),
              "glibc": $(json_string "$(ldd --version 2>/dev/null | head -1)")},
  "setup_problems": [$problems],
  "steps": [$steps],
  "kernels": $(json_file "$out/bench_kernels.json"),
  "cuda_graphs": $(json_file "$out/bench_cuda_graphs.json"),
  "train": {"test_accuracy": $(json_number "$train_accuracy"),
            "samples_per_s": $(json_number "$train_rate")},
  "amp": {$amp},
  "torch": $(json_file "$out/torch.json"),
  "zoo": $(json_file "$out/zoo.json"),
  "ratios": {"mpigrad_vs_torch_eager_samples_per_s": $(json_number "$eager_ratio"),
             "mpigrad_vs_torch_compile_samples_per_s": $(json_number "$compile_ratio")}
}
EOF
  mv "$out/summary.json.tmp" "$out/summary.json"
}
finish() {  # status line exit-code: the one line on the terminal
  status=$1
  status_line=$2
  write_summary
  printf 'gpu-check: %s\n' "$status_line"
  exit "$3"
}

# ---- Setup 1: the CUDA, cuDNN and NCCL libraries and the driver -------------------------------
pythons=()
for candidate in "${MPIGRAD_PYTHON:-}" "$(command -v python3 2>/dev/null)" \
  /opt/torch/.venv/bin/python3 /opt/conda/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
  [ -n "$candidate" ] && [ -x "$candidate" ] || continue
  case " ${pythons[*]-} " in *" $candidate "*) continue ;; esac
  pythons+=("$candidate")
done
candidate_dirs=()
add_dir() {
  [ -d "$1" ] || return 0
  local dir
  dir=$(readlink -f "$1")
  case " ${candidate_dirs[*]-} " in *" $dir "*) ;; *) candidate_dirs+=("$dir") ;; esac
}
IFS=: read -r -a user_dirs <<<"${MPIGRAD_CUDA_LIB_DIRS:-}"
for dir in "${user_dirs[@]}"; do add_dir "$dir"; done
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/cuda-*/lib64; do
  add_dir "$dir"
done
for python in "${pythons[@]}"; do
  while read -r site; do
    for dir in "$site"/nvidia/*/lib; do add_dir "$dir"; done
  done < <(timeout 30 "$python" -c 'import site; print("\n".join(site.getsitepackages()))' \
    2>/dev/null)
done
for dir in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
  /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib; do
  add_dir "$dir"
done
log "candidate library folders: ${candidate_dirs[*]-none}"
ldconfig_has() { ldconfig -p 2>/dev/null | grep "^[[:space:]]*$1 " > /dev/null; }  # not -q: pipefail
lib_dirs=()
use_dir() {
  case " ${lib_dirs[*]-} " in *" $1 "*) ;; *) lib_dirs+=("$1") ;; esac
}
# The CUDA libraries the bundle needs, then the ones cuDNN loads at run time if it finds them.
for soname in $bundle_cuda_sonames libnvrtc.so.13 libnvJitLink.so.13; do
  found=""
  for dir in "${candidate_dirs[@]}"; do
    if [ -e "$dir/$soname" ]; then found=$dir; break; fi
  done
  if [ -n "$found" ]; then
    use_dir "$found"
    log "$soname: $found"
  elif ldconfig_has "$soname"; then
    log "$soname: in the loader's cache"
  else
    case " $bundle_cuda_sonames " in
      *" $soname "*)
        setup_problems+=("$soname not found (looked in ${candidate_dirs[*]-nothing} and ldconfig)")
        ;;
      *) log "$soname: not found (optional)" ;;
    esac
  fi
done
driver=""
for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
  /usr/lib/wsl/lib; do
  if [ -e "$dir/libcuda.so.1" ]; then driver=$dir; break; fi
done
if [ -n "$driver" ]; then
  use_dir "$driver"
  log "libcuda.so.1 (the driver): $driver"
else
  log "libcuda.so.1 (the driver): not found; CUDA will report no driver"
fi
lib_dirs_text="${lib_dirs[*]-}"
library_path=$bundle/lib
for dir in "${lib_dirs[@]}"; do library_path+=":$dir"; done
export LD_LIBRARY_PATH=$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# ---- Setup 2: glibc, libstdc++, and every program and library resolving ----------------------
glibc=$(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+$')
log "glibc $glibc here; the bundle needs $bundle_glibc_needed"
if [ -z "$glibc" ] || [ "$(printf '%s\n%s\n' "$bundle_glibc_needed" "$glibc" | sort -V | head -1)" \
  != "$bundle_glibc_needed" ]; then
  setup_problems+=("glibc ${glibc:-unknown} is older than the bundle's $bundle_glibc_needed")
fi
libstdcxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" {print $NF; exit}')
if [ -n "$libstdcxx" ] && ! grep -qa "GLIBCXX_$bundle_glibcxx_needed" "$libstdcxx"; then
  setup_problems+=("$libstdcxx lacks GLIBCXX_$bundle_glibcxx_needed, which the bundle needs")
fi
for file in "$bundle"/bin/* "$bundle"/lib/*.so* "$bundle"/lib/openmpi/*.so \
  "$bundle"/lib/pmix/*.so; do
  [ -L "$file" ] && continue
  [ -f "$file" ] || continue  # a pattern that matched nothing
  [ "$(head -c 4 "$file" | od -An -c | tr -d ' ')" = "177ELF" ] || continue
  while read -r line; do
    setup_problems+=("${file#"$bundle"/}: ${line//[[:space:]]/ }")
  done < <(ldd "$file" 2>&1 | grep 'not found')
done

# ---- Setup 3: Open MPI and PMIx from the bundle, HDF5, BLAS -------------------------------------
export PATH=$bundle/bin:$PATH
export OPAL_PREFIX=$bundle OPAL_EXEC_PREFIX=$bundle OPAL_BINDIR=$bundle/bin OPAL_LIBDIR=$bundle/lib
export OPAL_LIBEXECDIR=$bundle/bin OPAL_PKGLIBDIR=$bundle/lib/openmpi OPAL_DATAROOTDIR=$bundle/share
export OPAL_DATADIR=$bundle/share OPAL_PKGDATADIR=$bundle/share/openmpi
export OPAL_SYSCONFDIR=$bundle/etc/openmpi
export PMIX_PREFIX=$bundle PMIX_EXEC_PREFIX=$bundle PMIX_BINDIR=$bundle/bin PMIX_LIBDIR=$bundle/lib
export PMIX_PKGLIBDIR=$bundle/lib/pmix PMIX_DATADIR=$bundle/share PMIX_PKGDATADIR=$bundle/share/pmix
export PMIX_SYSCONFDIR=$bundle/etc
# PMIx searches its components in the folder compiled into it whatever the variables above say.
export PMIX_MCA_mca_base_component_path=$bundle/lib/pmix
# Root (device machines run commands as root), one node: shared memory between ranks, no
# network transports, no single-copy mechanism that needs ptrace rights.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_plm=isolated
export TMPDIR=${TMPDIR:-/tmp}
# PMIx reads $HOME (or the password database, which a bare container may lack) for its
# per-user settings, and crashes without either: env -i leaves HOME unset.
export HOME=${HOME:-$out}
# hwloc (Open MPI's topology) and HDF5 load plugins from folders compiled into them: give them
# empty ones, so neither picks up whatever that machine has (or lacks) there.
export HWLOC_PLUGINS_PATH=$bundle/lib/hwloc-plugins
export HDF5_USE_FILE_LOCKING=FALSE HDF5_PLUGIN_PATH=$bundle/lib/hdf5-plugins
mkdir -p "$HWLOC_PLUGINS_PATH" "$HDF5_PLUGIN_PATH"
# Debian's OpenBLAS 0.3.21 does not know newer AVX-512 CPUs and would fall back to slow kernels
# for the CPU references of the GPU tests.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
export PYTHONUNBUFFERED=1
log "Open MPI and PMIx from $bundle; btl $OMPI_MCA_btl; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-}"
if [ ${#setup_problems[@]} -gt 0 ]; then
  for problem in "${setup_problems[@]}"; do log "setup problem: $problem"; done
  finish setup_failed "setup failed: ${setup_problems[0]}$( [ ${#setup_problems[@]} -gt 1 ] &&
    echo " (and $((${#setup_problems[@]} - 1)) more)"); see $setup_log" 1
fi

# ---- Setup 4: MPI from the bundle, the data and the config, on the CPU -------------------------
# One step of the main job's config under the bundle's mpirun on 2 ranks, and as a plain program
# (a singleton MPI_Init, for which Open MPI starts the bundle's orted). Open MPI's framed help
# messages there mean something in its set-up is off even if the run passed.
train_args=(--config "$bundle/examples/fashion_mnist_cnn.ini"
  "--data.train=$data/train-00000-of-00002.h5,$data/train-00001-of-00002.h5"
  "--data.test=$data/test.h5")
# --dry-run runs one step, which the config's 100 warm-up steps would not fit in.
dry_run=(train "${train_args[@]}" --distributed.backend=mpi --sched.warmup_steps=0 --dry-run)
for launch in "mpirun -np 2" singleton; do
  : >"$out/setup_mpi.log"
  if [ "$launch" = singleton ]; then
    MPIGRAD_DEVICE=cpu timeout -k 5 90 "$bundle/bin/mpigrad" "${dry_run[@]}" \
      >"$out/setup_mpi.log" 2>&1
  else
    MPIGRAD_DEVICE=cpu timeout -k 5 90 mpirun -np 2 "$bundle/bin/mpigrad" "${dry_run[@]}" \
      >"$out/setup_mpi.log" 2>&1
  fi
  rc=$?
  log "$launch mpigrad train --dry-run on the CPU (exit $rc):"
  cat "$out/setup_mpi.log" >>"$setup_log"
  if [ "$rc" -ne 0 ] || ! grep -q "dry run passed" "$out/setup_mpi.log"; then
    setup_problems+=("$launch mpigrad train --dry-run on the CPU failed (exit $rc)")
  elif grep -q '^-----------------------------' "$out/setup_mpi.log"; then
    setup_problems+=("Open MPI printed a warning in the $launch CPU dry run")
  fi
done
rm -f "$out/setup_mpi.log"

# ---- Setup 5: the GPU ----------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then timeout 20 nvidia-smi >>"$setup_log" 2>&1; fi
devices_text=$(timeout -k 5 60 "$bundle/bin/mpigrad" devices 2>&1)
devices_rc=$?
log "mpigrad devices (exit $devices_rc): $devices_text"
if [ "$devices_rc" -ne 0 ]; then
  reason=$(printf '%s' "$devices_text" | head -1)
  if [ ${#setup_problems[@]} -gt 0 ]; then
    for problem in "${setup_problems[@]}"; do log "setup problem: $problem"; done
    finish setup_failed "$reason; and setup failed: ${setup_problems[0]} (see $setup_log)" 1
  fi
  if [ "$devices_rc" -eq 2 ]; then
    finish no_gpu "$reason; setup passed, nothing was run on a GPU" 2
  fi
  finish broken_gpu "${reason:-mpigrad devices failed (exit $devices_rc)}; no GPU test can run" 1
fi
gpu_count=$(printf '%s\n' "$devices_text" | grep -c '^cuda:')
printf 'gpu-check: %s\n' "$(printf '%s\n' "$devices_text" | head -1)"
failures=${#setup_problems[@]}
for problem in "${setup_problems[@]}"; do printf 'gpu-check: setup problem: %s\n' "$problem"; done

# ---- The steps ------------------------------------------------------------------------------
# run_step NAME TIMEOUT COMMAND...: the command's output goes to OUTDIR/NAME.log.
run_step() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - $(elapsed)))
  if [ "$left" -lt 15 ]; then
    steps_json+=("{\"name\": $(json_string "$name"), \"status\": \"not run\",\
 \"detail\": \"no time left\"}")
    failures=$((failures + 1))
    printf 'gpu-check: %-16s not run: no time left\n' "$name"
    write_summary
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  local t0 t1 rc state detail
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  case "$rc" in
    0) state=passed ;;
    124 | 137) state=timeout ;;
    *) state=failed ;;
  esac
  [ "$state" = passed ] || failures=$((failures + 1))
  # The line that says how it went: doctest's count, the skip/fail line, the trainer's last
  # word; otherwise the log's last line.
  local outcome='^\[doctest\] test cases:|test cases (skipped|not run|cannot run)|cannot run'
  outcome+='|mpigrad train: (done|error)'
  detail=$(grep -E "$outcome" "$out/$name.log" | tail -1)
  [ "$name" != torch ] ||
    detail=$(grep -E '^torch (eager|amp_bf16|amp_fp16|compile)' "$out/$name.log" | tr '\n' ';')
  [ "$name" != zoo ] || detail=$(grep -E '^zoo ' "$out/$name.log" | tr '\n' ';')
  [ -n "$detail" ] || detail=$(grep -v '^[[:space:]]*$' "$out/$name.log" | tail -1)
  detail=${detail:0:400}
  local seconds
  seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}')
  steps_json+=("{\"name\": $(json_string "$name"), \"status\": \"$state\", \"exit_code\": $rc,\
 \"seconds\": $seconds, \"timeout_s\": $limit, \"log\": $(json_string "$name.log"),\
 \"detail\": $(json_string "$detail")}")
  printf 'gpu-check: %-16s %-7s %6ss  %s\n' "$name" "$state" "$seconds" "$detail"
  write_summary
}

export MPIGRAD_REQUIRE_GPU=1 MPIGRAD_COLLECTIVE_TIMEOUT=60
run_step cuda_tests 75 "$bundle/bin/mpigrad-test-cuda"
run_step nn_cuda_tests 60 "$bundle/bin/mpigrad-test-nn-cuda"
run_step nccl_tests 30 "$bundle/bin/mpigrad-test-nccl"
# Under the bundle's mpirun, with as many ranks as GPUs (NCCL needs one each), at most 2.
nccl_ranks=$((gpu_count >= 2 ? 2 : 1))
run_step nccl_tests_mpirun 30 mpirun -np "$nccl_ranks" "$bundle/bin/mpigrad-test-nccl"
# NCCL's collective timeout: rank 1 withholds its part of an all-reduce; rank 0's report must name
# it, abort the NCCL communicator and end the job non-zero. NCCL refuses two ranks on one GPU.
nccl_timeout_check='
MPIGRAD_COLLECTIVE_TIMEOUT=5 mpirun -np 2 "$1" withhold-rank-1 >"$2" 2>&1
rc=$?
cat "$2"
[ "$rc" -ne 0 ] || { echo "nccl_timeout: FAILED: the job exited 0"; exit 1; }
for pattern in "collective timeout on communicator .nccl world.: all_reduce #[0-9]+ .* on the GPU" \
  "^  ranks not arrived: 1$" "aborting its GPU collectives \(ncclCommAbort\) and the job"; do
  grep -Eq -- "$pattern" "$2" || { echo "nccl_timeout: FAILED: the report lacks /$pattern/"; exit 1; }
done
echo "nccl_timeout: passed: rank 0 reported rank 1 missing, aborted NCCL, job exit status $rc"'
if [ "$gpu_count" -ge 2 ]; then
  run_step nccl_timeout 40 bash -c "$nccl_timeout_check" nccl_timeout \
    "$bundle/bin/mpigrad-test-nccl" "$out/nccl_timeout.job.log"
else
  steps_json+=("{\"name\": \"nccl_timeout\", \"status\": \"skipped\",\
 \"detail\": \"needs 2 GPUs ($gpu_count visible)\"}")
  printf 'gpu-check: %-16s skipped: needs 2 GPUs (%s visible)\n' nccl_timeout "$gpu_count"
  write_summary
fi
run_step bench_kernels 50 "$bundle/bin/mpigrad-bench-kernels" --json "$out/bench_kernels.json"
run_step bench_cuda_graphs 30 "$bundle/bin/mpigrad-bench-embed" --cuda-graphs \
  --json "$out/bench_cuda_graphs.json"
run_step train 80 env MPIGRAD_DEVICE=cuda:0 mpirun -np 1 "$bundle/bin/mpigrad" train \
  "${train_args[@]}" "--train.out_dir=$out/train"
# The same network defined in PyTorch and loaded from ONNX (issue 23), one epoch.
run_step train_onnx 60 env MPIGRAD_DEVICE=cuda:0 mpirun -np 1 "$bundle/bin/mpigrad" train \
  --config "$bundle/examples/fashion_mnist_onnx.ini" "${train_args[@]:2}" \
  "--model.file=$bundle/examples/fashion_cnn.legacy.onnx" --train.epochs=1 \
  "--train.out_dir=$out/train_onnx"
train_line=$(grep '^mpigrad train: done' "$out/train.log" 2>/dev/null | tail -1)
train_rate=$(printf '%s' "$train_line" | sed -n 's/.*throughput \([0-9.]*\) samples\/s.*/\1/p')
train_accuracy=$(printf '%s' "$train_line" | sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p')
write_summary
# Autocast (issue 24): the same CNN for one epoch in each precision, fp32 first as the baseline.
for precision in fp32 bf16 fp16; do
  run_step "amp_$precision" 40 env MPIGRAD_DEVICE=cuda:0 mpirun -np 1 "$bundle/bin/mpigrad" train \
    "${train_args[@]}" "--train.precision=$precision" --train.epochs=1 \
    "--train.out_dir=$out/amp_$precision"
  amp_line=$(grep '^mpigrad train: done' "$out/amp_$precision.log" 2>/dev/null | tail -1)
  amp_rate[$precision]=$(printf '%s' "$amp_line" |
    sed -n 's/.*throughput \([0-9.]*\) samples\/s.*/\1/p')
  amp_accuracy[$precision]=$(printf '%s' "$amp_line" |
    sed -n 's/.*test accuracy \([0-9.]*\).*/\1/p')
  write_summary
done

# PyTorch: the python that has torch and h5py, without the bundle's libraries in its way.
torch_python=""
for python in "${pythons[@]}"; do
  if env -u LD_LIBRARY_PATH timeout 60 "$python" -c 'import torch, h5py' >/dev/null 2>&1; then
    torch_python=$python
    break
  fi
done
if [ -n "$torch_python" ]; then
  # The script's own limit leaves the step's timeout room for importing torch.
  left=$((budget - $(elapsed) - 30))
  run_step torch 130 env -u LD_LIBRARY_PATH "$torch_python" \
    "$bundle/benchmarks/torch_fashion_mnist.py" \
    --train "$data/train-00000-of-00002.h5,$data/train-00001-of-00002.h5" --test "$data/test.h5" \
    --epochs 3 --amp-epochs 1 --modes eager,amp_bf16,amp_fp16,compile \
    --json "$out/torch.json" --time-limit "$((left < 100 ? left : 100))"
  # The zoo's GPU arm: its python runs without the bundle's libraries, the mpigrad it starts
  # with them. A model that would start after --time-limit is left out, not cut off.
  left=$((budget - $(elapsed) - 30))
  run_step zoo 90 env -u LD_LIBRARY_PATH "$torch_python" "$bundle/benchmarks/zoo/gpu_arm.py" \
    --mpigrad "$bundle/bin/mpigrad" --ld-library-path "${LD_LIBRARY_PATH:-}" --work "$out/zoo" \
    --json "$out/zoo.json" --time-limit "$((left < 45 ? left : 45))"
else
  for name in torch zoo; do
    steps_json+=("{\"name\": \"$name\", \"status\": \"not run\", \"detail\":\
 $(json_string "no python3 with torch and h5py (tried ${pythons[*]-none})")}")
    failures=$((failures + 1))
    printf 'gpu-check: %-16s not run: no python3 with torch and h5py\n' "$name"
  done
fi

if [ "$failures" -eq 0 ]; then
  line="all steps passed in $(elapsed) s; test accuracy ${train_accuracy:-?},"
  finish passed "$line ${train_rate:-?} samples/s; see $out/summary.json" 0
fi
finish failed "$failures step(s) failed or did not run, in $(elapsed) s; see $out/summary.json" 1
