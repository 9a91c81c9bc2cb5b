#!/usr/bin/env bash
# The one script for a lent GPU machine (about 8 minutes on 16 cores before
# the capacity part, which may add up to 8 more: run it with the device tool's
# timeout at 600 s and PARTS="tests bench train step", then PARTS=capacity in
# a second call on the warm machine, whose build is kept). It builds strata with CUDA from
# the Debian packages it carries (scripts/fetch-gpu-deps fills .deps-gpu
# here; the GPU machine cannot download anything), runs the tests labelled
# `gpu` (every CUDA op, the fused attention, fp32/bf16/fp16 blocks and a
# whole-model step through the GPT's ops against the host reference, the
# CUDA trainer against the host backend, and the GPT on the session against
# the host backend and that trainer, device-to-device copies included; the
# C API's session calls on the caller's own CUDA streams, a new one each
# step, against the host backend's bits), the
# GPU benchmark, the
# trainer on the GPU (`strata-train --device cuda`), and the offloaded step
# on the GPU (`strata-stepbench --device cuda`, states in RAM, then on NVMe
# where the disk takes O_DIRECT, and the trainer with its states and
# gradients there), `strata capacity --device cuda` on short settings (a
# 4 GiB device budget, modes 1-3, then 4-5 on NVMe where the disk takes
# O_DIRECT), and prints a short table last.
#   device run: bash bench/gpu_check.sh   (carry: [".deps-gpu"])
# PARTS picks what runs after the build (default: "tests bench train step capacity").
# Without the engine's packages in .deps-gpu it builds only common/, gpu/,
# their tests and the GPU benchmark, as it did before the engine existed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/strata-gpu-check}"
PARTS="${PARTS:-tests bench train step capacity}"
mkdir -p "$OUT"
rm -f "$OUT"/ctest.log "$OUT"/gpubench.txt "$OUT"/train*.txt "$OUT"/stepbench*.txt "$OUT"/capacity*
log() { echo "== $*"; }
wants() { [[ " $PARTS " == *" $1 "* ]]; }

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
LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
# The carried libraries (liburing, hwloc, oneTBB, xxHash and what they need)
# are found at link and run time from the prefix; pkg-config is carried too.
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
FULL=OFF
if [[ -x "$PREFIX/usr/bin/pkgconf" && -e "$LIBDIR/liburing.so" && -e "$LIBDIR/libtbb.so" ]]; then
  FULL=ON
  export PKG_CONFIG="$PREFIX/usr/bin/pkgconf"
  export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
fi

if [[ $FULL == ON ]]; then
  log "configure + build (everything, from the carried packages)"
  FLAGS=(-DSTRATA_ALL_DEPS=OFF)
else
  log "configure + build (GPU parts only: the engine's packages are not in .deps-gpu)"
  FLAGS=(-DSTRATA_GPU_CHECK_ONLY=ON)
fi
cmake -S . -B build/gpu-check -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON "${FLAGS[@]}" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr;$LIBDIR/cmake" -DCMAKE_CUDA_ARCHITECTURES=90 \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu-check -j "$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
BIN=build/gpu-check/bench
TOOLS=build/gpu-check/tools

if wants tests; then
  log "tests labelled gpu"
  (cd build/gpu-check && ctest -L gpu --output-on-failure 2>&1 | tee "$OUT/ctest.log" | tail -25)
fi

if wants bench; then
  log "GPU benchmark"
  timeout 240 $BIN/strata-gpubench --reps 5 2>&1 | tee "$OUT/gpubench.txt"
fi

if [[ $FULL == ON ]] && wants train; then
  log "strata-train on the GPU (the embedded default, states in RAM; then streamed through a 64 MiB device)"
  timeout 120 $TOOLS/strata-train --device cuda --steps 30 2>&1 | tee "$OUT/train.txt" |
    grep -E "^step +(1|10|20|30) |^strata-train:"
  timeout 120 $TOOLS/strata-train --device cuda --steps 30 --stream-weights --prefetch 2 2>&1 | tee "$OUT/train_streamed.txt" |
    grep -E "^step +(1|10|20|30) |^strata-train:"
  log "strata-train on the GPU, block inputs offloaded to host RAM (stream-ordered saves and loads; the losses of train_streamed.txt)"
  timeout 120 $TOOLS/strata-train --device cuda --steps 30 --stream-weights --prefetch 2 --activations-on host 2>&1 |
    tee "$OUT/train_acts_host.txt" | grep -E "^step +(1|10|20|30) |^strata-train:"
fi

if [[ $FULL == ON ]] && wants step; then
  log "strata-stepbench on the GPU (states in RAM)"
  timeout 180 $BIN/strata-stepbench --device cuda --states ram --reps 3 2>&1 | tee "$OUT/stepbench_ram.txt" | grep -vE "^\{"
  SB=$(mktemp -d /tmp/strata-sb.XXXXXX)
  if dd if=/dev/zero of="$SB/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
    log "strata-stepbench on the GPU (states on NVMe in $SB)"
    timeout 180 $BIN/strata-stepbench --device cuda --dir "$SB" --reps 3 2>&1 | tee "$OUT/stepbench_nvme.txt" | grep -vE "^\{"
    log "strata-train on the GPU with the states and gradients on NVMe (the embedded default; the losses of train.txt)"
    mkdir -p "$SB/train"
    timeout 120 $TOOLS/strata-train --device cuda --steps 30 --nvme "$SB/train" --gradients-on nvme 2>&1 |
      tee "$OUT/train_grads_nvme.txt" | grep -E "^step +(1|10|20|30) |^strata-train:"
  else
    echo "$SB does not take O_DIRECT: the NVMe stepbench is skipped" | tee "$OUT/stepbench_nvme.txt"
  fi
  rm -rf "$SB"
fi

if [[ $FULL == ON ]] && wants capacity; then
  log "strata capacity on the GPU (4 GiB device budget, 16 GiB host, modes 1-3)"
  timeout 240 $TOOLS/strata capacity --device cuda --device-budget 4GiB --host-budget 16GiB --modes 1,2,3 \
    --steps 3 --json "$OUT/capacity.json" 2>&1 | tee "$OUT/capacity.txt" | awk '/^mode          /{p=1} p'
  CP=$(mktemp -d /tmp/strata-cap.XXXXXX)
  if dd if=/dev/zero of="$CP/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
    log "strata capacity on the GPU, NVMe modes (states in $CP, 16 GiB of it)"
    timeout 240 $TOOLS/strata capacity --device cuda --device-budget 4GiB --host-budget 16GiB --modes 4,5 \
      --nvme "$CP" --nvme-budget 16GiB --steps 3 --json "$OUT/capacity_nvme.json" 2>&1 |
      tee "$OUT/capacity_nvme.txt" | awk '/^mode          /{p=1} p'
  else
    echo "$CP does not take O_DIRECT: the NVMe capacity modes are skipped" | tee "$OUT/capacity_nvme.txt"
  fi
  rm -rf "$CP"
fi

log "summary"
grep -E "tests passed|tests failed" "$OUT/ctest.log" 2>/dev/null || echo "ctest did not run or finish"
grep -vE "^\{" "$OUT/gpubench.txt" 2>/dev/null | tail -16
for f in train train_streamed train_acts_host train_grads_nvme; do
  [[ -f "$OUT/$f.txt" ]] && echo "$f: $(grep -E '^step|^strata-train:' "$OUT/$f.txt" | sed -n '1p;$p' | sed -E 's/ \| h2d.*//' | tr '\n' ' ')"
done
for f in stepbench_ram stepbench_nvme; do
  [[ -f "$OUT/$f.txt" ]] && echo "$f: $(grep -E 'overlap efficiency|does not take|^strata-stepbench: [A-Z_]+:' "$OUT/$f.txt" | tail -1)"
done
for f in capacity capacity_nvme; do
  [[ -f "$OUT/$f.txt" ]] && echo "$f:" && awk '/^mode          /{p=1} /^$/{if(p)exit} p; /does not take/' "$OUT/$f.txt"
done
