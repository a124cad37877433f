#!/usr/bin/env bash
# Installs the Debian packages mpigrad builds, tests and runs with; does nothing when they are
# all present, so it is cheap to call before every build. Needs root (or sudo) only to install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-dev
  libzstd-dev nlohmann-json3-dev  # ALCHEMI's Zarr stores: zstd chunks, zarr.json metadata
  libboost-program-options-dev
  doctest-dev
  libopenblas-dev
  libonnx-dev libprotobuf-dev libonnx-testdata
  libdnnl-dev
  gfortran
  dataset-fashion-mnist
  iproute2 procps util-linux  # scripts/cluster-sim.sh and its tests: ip, tc, pgrep, nsenter
  xz-utils  # scripts/gpu-check.sh packs the bundle with xz
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
