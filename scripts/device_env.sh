# Source this at the top of a command run on the GPU machine (the device tool's copy of the
# working tree, with the ignored folder .device/ carried), as bench/results/*/call*/run.sh do:
#
#   .device/cutlass.tgz        CUTLASS's source tree (the nvidia-cutlass wheel's), packed
#   .device/bin/fact-engine    the engine built on the CPU machine (strip build/fact-engine)
#
# It unpacks CUTLASS into .gpu/cutlass, exports CUTLASS_DIR, FACT_ENGINE, FACT_CACHE_DIR,
# FACT_REGISTRY (seeded on first use by scripts/gpu_bench.sh), PYTHON and PYTHONPATH, points OUT
# at $OUT/r and RUNS at .gpu/runs, and packs $OUT/r into $OUT/res.tgz when the shell exits, so
# that the results come back as one file however many there are. It also records the GPU's
# clocks, power and temperature in $OUT/smi.txt.
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine \
  FACT_CACHE_DIR=$PWD/.gpu/cache FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 \
  PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RUNS=$PWD/.gpu/runs
FACT_DEVICE_OUT=$OUT
mkdir -p "$FACT_DEVICE_OUT/r"
trap 'cd "$FACT_DEVICE_OUT" && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$FACT_DEVICE_OUT/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > "$OUT/smi.txt"

# The held-out calls' start: the kernels compiled on the CPU machine (.device/kcache.tar.xz, where
# carried) into the cache, and a new registry seeded with the shipped configs and lowerings.
fact_device_seed() {
  mkdir -p "$FACT_CACHE_DIR"
  [ -f .device/kcache.tar.xz ] && tar xJf .device/kcache.tar.xz -C "$FACT_CACHE_DIR"
  [ -f "$FACT_REGISTRY" ] || { "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null &&
    python3 -m fact agent import data/lowerings.json > /dev/null; }
}

# Compile the kernels of problem files into the cache before anything is timed, four problems at
# a time with four nvcc jobs each (the machine's 16 cores; the CPU machine's two take about five
# minutes per GEMM problem): timings then never share the CPU with nvcc. Kernels already in the
# cache cost a few seconds. At most PREWARM_S seconds (default 300); logs in $OUT/prewarm/.
# Usage: fact_device_prewarm DTYPE PRECISION PROBLEM.py ...
fact_device_prewarm() {
  local dtype=$1 precision=$2
  shift 2
  mkdir -p "$OUT/prewarm"
  printf '%s\n' "$@" | timeout "${PREWARM_S:-300}" xargs -d '\n' -P4 -I{} sh -c '
    n=$(basename "$1" .py)
    python3 -m fact realize "$1" --dtype "$2" --precision "$3" --candidates 4 --jobs 4 \
      --out "$RUNS/prewarm/$n" > "$OUT/prewarm/$n.log" 2>&1
    echo "prewarm $n rc=$?"' _ {} "$dtype" "$precision"
}
