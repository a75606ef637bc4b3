#!/usr/bin/env bash
# Installs the distribution packages nsa builds with (Debian 12 / Ubuntu 22.04+ names), only those
# missing. Needs root or sudo. The CUDA toolkit is optional and never installed here: when
# /usr/local/cuda is present the CUDA backend is built too. With --python (the tests and
# install_python.sh; not the demo): python3-torch and python3-pytest for the Python package and its
# tests (python/tests), and OpenBLAS, because without it Debian's torch falls back to the reference
# BLAS, several times slower.
#   bash scripts/install_deps.sh [--python]
set -euo pipefail

packages=(g++ cmake ninja-build pkg-config clang-format
          libgtest-dev libgmock-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
          libsentencepiece-dev sentencepiece openmpi-bin libopenmpi-dev)
if [ "${1:-}" = --python ]; then
  packages+=(python3-torch python3-pytest python3-numpy libopenblas0-pthread)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
