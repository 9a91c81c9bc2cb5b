#!/usr/bin/env bash
# The one script for a lent GPU machine (about 6 minutes): builds the GPU
# parts (common/, gpu/, their tests, strata-gpubench), runs the tests
# labelled `gpu` (every CUDA op, the fused attention, fp32/bf16/fp16 blocks
# and a whole-model step through ModelOps, against the host reference), then
# the GPU benchmark, and prints a short table last. Run scripts/fetch-gpu-deps
# here first and carry .deps-gpu: the GPU machine cannot download packages.
#   device run: bash bench/gpu_check.sh   (carry: [".deps-gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/strata-gpu-check}"
mkdir -p "$OUT"
log() { echo "== $*"; }

log "machine"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi not available"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
nvcc --version | tail -1
cmake --version | head -1

PREFIX=/tmp/strata-deps
if ls .deps-gpu/*.deb >/dev/null 2>&1; then
  log "unpacking $(ls .deps-gpu/*.deb | wc -l) carried packages into $PREFIX"
  mkdir -p "$PREFIX"
  for deb in .deps-gpu/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$PREFIX"
    else
      (tmp=$(mktemp -d) && cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$PREFIX")
    fi
  done
fi

log "configure + build (GPU parts only)"
cmake -S . -B build/gpu-check -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON -DSTRATA_GPU_CHECK_ONLY=ON \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr;$PREFIX/usr/lib/x86_64-linux-gnu/cmake" -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu-check -j "$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }

log "tests labelled gpu"
(cd build/gpu-check && ctest -L gpu --output-on-failure 2>&1 | tee "$OUT/ctest.log" | tail -25)

log "benchmark"
timeout 300 build/gpu-check/bench/strata-gpubench --reps 5 2>&1 | tee "$OUT/gpubench.txt"

log "summary"
grep -E "tests passed|tests failed" "$OUT/ctest.log" || echo "ctest did not finish"
grep -vE "^\{" "$OUT/gpubench.txt" | tail -16
