#!/usr/bin/env bash
# The GPU check's bundle, proven on a machine without a GPU (ctest gpu_check_bundle):
#   check_bundle.sh <repo> <build dir> <scratch dir>
# 1. scripts/gpu-check.sh --bundle packs the existing build (--no-build: ctest must not build).
# 2. `env -i PATH=/usr/bin:/bin DIR/run.sh OUT` gets through all its setup (libraries, mpirun on
#    2 CPU ranks with the data and the config) and prints exactly one line: no GPU visible, with
#    the CUDA error quoted; exit status 2; OUT/summary.json says "no_gpu".
# 3. The same run with the loader's debug log shows that no program of the bundle loaded a
#    library from outside it, except glibc, the C++ runtime and the CUDA libraries.
# 4. With a copy whose `mpigrad devices` pretends there is a GPU, every step of the GPU half runs,
#    fails cleanly (no crash, no hang) and is recorded in a well-formed summary.json.
# 5. Where this machine allows (root, chroot, mount), the run is repeated inside a minimal chroot
#    holding only the bundle, bash and the few tools run.sh uses, glibc, the C++ runtime and the
#    CUDA libraries: no Open MPI, HDF5, OpenBLAS or Boost of this machine to fall back on.
set -euo pipefail
repo=$1
build=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
bundle=$work/gpu-bundle
fail() {
  echo "check_bundle: $*" >&2
  exit 1
}

if ! "$repo/scripts/gpu-check.sh" --bundle "$bundle" --no-build --build-dir "$build" \
  >"$work/bundle.log" 2>&1; then
  cat "$work/bundle.log" >&2
  fail "gpu-check.sh --bundle failed"
fi
tail -1 "$work/bundle.log"

# The one line, its exit status and summary.json: check_run <what> <output> <exit status> <summary>
expected='^gpu-check: no GPU visible: cudaGetDeviceCount failed with cudaError[A-Za-z]+ \(.+\); '
expected+='setup passed, nothing was run on a GPU$'
check_run() {
  local what=$1 output=$2 rc=$3 summary=$4
  [ "$rc" -eq 2 ] || fail "$what: exit status $rc, expected 2 (no GPU); output: $output"
  [ "$(printf '%s\n' "$output" | wc -l)" -eq 1 ] || fail "$what: more than one line: $output"
  printf '%s\n' "$output" | grep -Eq "$expected" || fail "$what: unexpected line: $output"
  grep -q '"status": "no_gpu"' "$summary" || fail "$what: summary.json does not say no_gpu"
  grep -q '"setup_problems": \[\]' "$summary" || fail "$what: summary.json lists setup problems"
  echo "$what: $output"
}

# The loader writes one log per process (a run makes well over a thousand), so they go in their
# own folder, removed once they have been read and found clean.
mkdir -p "$work/ld"
set +e
output=$(env -i PATH=/usr/bin:/bin LD_DEBUG=files LD_DEBUG_OUTPUT="$work/ld/log" \
  "$bundle/run.sh" "$work/out" 2>&1)
rc=$?
set -e
check_run "env -i run" "$output" "$rc" "$work/out/summary.json"

# Every library a bundle program loaded, from the loader's log of each process.
allowed='^(/lib|/usr/lib)(64)?(/x86_64-linux-gnu)?/'
allowed+='(ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl'
allowed+='|libstdc\+\+|libgcc_s)\.so|^/usr/local/cuda[^/]*/|^/etc/ld\.so\.cache$'
strays=""
for log in "$work"/ld/log.*; do
  # sed quits at its first match: `sed | head -1` under pipefail ends this script silently when
  # sed is still writing as head exits (SIGPIPE), which a busy CI machine made happen.
  program=$(sed -n 's/.*initialize program: \(.*\)$/\1/;T;p;q' "$log")
  [ -z "$program" ] && program=$(sed -n 's/.*needed by \([^ ]*\) .*/\1/;T;p;q' "$log")
  case "$program" in "$bundle"/* | *mpigrad* | orted | orterun | mpirun) ;; *) continue ;; esac
  while read -r path; do
    case "$path" in "$bundle"/*) continue ;; esac
    grep -Eq "$allowed" <<<"$path" && continue
    strays+="$program loaded $path"$'\n'
  done < <(sed -n 's/.*file=\([^ ]*\) .*/\1/p; s/.*calling init: \(.*\)$/\1/p' "$log" |
    grep '^/' | sort -u)
done
[ -z "$strays" ] || fail "bundle programs loaded libraries from outside the bundle:
$strays"
echo "loader log: every library the bundle's programs loaded is the bundle's, glibc's," \
  "the C++ runtime's or CUDA's"
rm -rf "$work/ld"

# ---- The GPU half's bookkeeping, with a pretend GPU ---------------------------------------------
# A copy of the bundle whose `mpigrad devices` claims a GPU: every step then runs, fails the way a
# missing GPU makes it fail (never a crash), and summary.json records each one.
pretend=$work/pretend-bundle
cp -a "$bundle" "$pretend"
mv "$pretend/bin/mpigrad" "$pretend/bin/mpigrad.real"
cat >"$pretend/bin/mpigrad" <<'EOF_PRETEND'
#!/usr/bin/env bash
if [ "${1:-}" = devices ]; then
  echo "cuda:0  Pretend GPU  1.0 GiB  compute capability 9.0  1 multiprocessors"
  exit 0
fi
exec "$(dirname "$0")/mpigrad.real" "$@"
EOF_PRETEND
chmod +x "$pretend/bin/mpigrad"
set +e
output=$(env -i PATH=/usr/bin:/bin "$pretend/run.sh" "$work/pretend-out" 2>&1)
rc=$?
set -e
summary=$work/pretend-out/summary.json
[ "$rc" -eq 1 ] || fail "pretend GPU: exit status $rc, expected 1; output: $output"
printf '%s\n' "$output" | tail -1 | grep -q '^gpu-check: 13 step(s) failed or did not run' ||
  fail "pretend GPU: unexpected last line: $output"
if command -v python3 >/dev/null; then
  python3 -m json.tool "$summary" >/dev/null || fail "pretend GPU: summary.json is not JSON"
fi
for step in cuda_tests nn_cuda_tests nccl_tests nccl_tests_mpirun bench_kernels bench_cuda_graphs \
  train_onnx train amp_fp32 amp_bf16 amp_fp16 torch zoo; do
  grep -q "\"name\": \"$step\"" "$summary" || fail "pretend GPU: no step $step in summary.json"
done
if grep -qE '"exit_code": (134|139|124|137)' "$summary"; then
  fail "pretend GPU: a step crashed or hung: $(grep -E '"exit_code": (134|139|124|137)' "$summary")"
fi
grep -q '"name": "train", "status": "failed".*MPIGRAD_DEVICE=cuda:0: cuda:0 is not available' \
  "$summary" || fail "pretend GPU: the training step does not report the missing GPU"
# The autocast runs' figures: one entry per precision, null where nothing was measured.
for precision in fp32 bf16 fp16; do
  grep -q "\"$precision\": {\"samples_per_s\": null, \"test_accuracy\": null, \"vs_fp32\": null" \
    "$summary" || fail "pretend GPU: summary.json has no amp entry for $precision"
done
# NCCL's timeout job needs 2 GPUs; with the one pretend GPU it is recorded as skipped, not failed.
grep -q '"name": "nccl_timeout", "status": "skipped", "detail": "needs 2 GPUs (1 visible)"' \
  "$summary" || fail "pretend GPU: nccl_timeout is not recorded as skipped for want of 2 GPUs"
echo "pretend GPU: all 13 steps ran and failed cleanly, nccl_timeout skipped (needs 2 GPUs);" \
  "summary.json records each"

# ---- The chroot, where allowed ----------------------------------------------------------------
if [ "$(id -u)" -ne 0 ] || ! command -v chroot >/dev/null; then
  echo "chroot check not possible here (needs root and chroot); the loader-log check stands"
  exit 0
fi
root=$work/root
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mkdir -p "$root"/usr/bin "$root"/usr/lib/x86_64-linux-gnu "$root"/usr/lib64 \
  "$root"/usr/local/cuda/lib64 "$root"/proc "$root"/dev "$root"/sys "$root"/tmp "$root"/etc
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
copy_with_libs() {  # a program and the libraries it loads, at the same paths
  local file=$1 lib
  [ -e "$root$file" ] || cp -L "$file" "$root$file"
  while read -r lib; do
    if [ -n "$lib" ] && [ ! -e "$root$lib" ]; then
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    fi
  done < <(ldd "$file" 2>/dev/null | awk '/=>/ {print $3} !/=>/ && $1 ~ /^\// {print $1}')
}
for tool in bash dirname readlink mkdir date cat sed grep tr od head tail mv rm sort timeout \
  env ldd wc id uname; do
  copy_with_libs "$(command -v "$tool")"
done
copy_with_libs "$(readlink -f "$(command -v awk)")"
ln -sf "$(basename "$(readlink -f "$(command -v awk)")")" "$root/usr/bin/awk"
# glibc whole (as every Linux has it) and the C++ runtime: what the bundle leaves to the machine.
for lib in libc.so.6 libm.so.6 libmvec.so.1 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 \
  libutil.so.1 libanl.so.1 libstdc++.so.6 libgcc_s.so.1; do
  [ -e "/usr/lib/x86_64-linux-gnu/$lib" ] &&
    cp -L "/usr/lib/x86_64-linux-gnu/$lib" "$root/usr/lib/x86_64-linux-gnu/"
done
# The CUDA libraries the bundle was checked against, as a GPU machine's toolkit would hold them.
cuda_dir=$(ldd "$build/bin/mpigrad" | awk '$1 ~ /^libcudart\.so/ {print $3}' | xargs dirname)
# shellcheck source=/dev/null
. "$bundle/manifest.sh"
for name in $bundle_cuda_sonames; do
  lib=$cuda_dir/$name
  [ -e "$lib" ] || continue
  target=$root/usr/local/cuda/lib64/$(basename "$lib")
  # A hard link costs nothing where the scratch folder shares the toolkit's file system.
  cp -al "$(readlink -f "$lib")" "$target" 2>/dev/null || cp -L "$lib" "$target"
done
cp -al "$bundle" "$root/bundle"
if ! { mount -t proc proc "$root/proc" && mounted+=("$root/proc") &&
  mount --bind /dev "$root/dev" && mounted+=("$root/dev") &&
  mount --bind /sys "$root/sys" && mounted+=("$root/sys"); }; then
  echo "chroot check not possible here (mounts refused); the loader-log check stands"
  exit 0
fi
set +e
output=$(chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin /bundle/run.sh /out 2>&1)
rc=$?
set -e
check_run "chroot run (no Open MPI, HDF5, OpenBLAS or Boost outside the bundle)" "$output" "$rc" \
  "$root/out/summary.json"
