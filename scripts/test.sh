#!/usr/bin/env bash
# Run FACT's tests that need no GPU: the C++ unit tests (ctest label "cpu") and the Python suite
# (GPU tests are marked `gpu` and skip themselves without one). Run ./setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -L cpu
.venv/bin/python -m pytest -q tests/python "$@"
