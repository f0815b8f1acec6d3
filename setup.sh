#!/usr/bin/env bash
# Set up FACT on a fresh Debian/Ubuntu machine: system packages, a Python virtual environment with
# FACT and its dependencies (.venv), and the C++ engine (build/fact-engine). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if command -v apt-get >/dev/null 2>&1; then
  echo "== system packages"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    cmake g++ make binutils nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libsqlite3-dev \
    libssl-dev >/dev/null
fi
python3 -c 'import venv, ensurepip' 2>/dev/null || $SUDO apt-get install -y -qq python3-venv >/dev/null

echo "== python environment (.venv): FACT, torch and friends"
# torch with its CUDA wheels takes about 6 GiB once installed. Say so up front rather than let pip
# die half way with "No space left on device"; and keep no wheel cache, which would double it.
if ! { [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; }; then
  free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
  need_kib=$((7 * 1024 * 1024))
  if [ "${free_kib:-0}" -lt "$need_kib" ]; then
    echo "setup.sh: torch and its CUDA libraries need about 7 GiB free under $PWD;" \
      "the disk has $((free_kib / 1024)) MiB free. Free some space and run ./setup.sh again." >&2
    exit 1
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
export PIP_NO_CACHE_DIR=1
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

echo "== C++ engine (build/)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

echo "== pattern registry: vetted configs measured on the H200 (data/registry_seed.json)"
./build/fact-engine registry import data/registry_seed.json
echo "== lowerings of ops the catalog lacks, each checked by the agent's gates (data/lowerings.json)"
.venv/bin/fact agent import data/lowerings.json ||
  echo "warning: some shipped lowerings failed the gates here (above); those ops stay in PyTorch"
echo "== ready: .venv/bin/fact discover examples/minigpt_block.py --dtype bf16"
