#!/bin/sh
# Installs strata from BUILD_DIR into a fresh prefix, then builds and runs
# the consumer of tests/install/consumer and examples/custom_mlp.c against
# that prefix alone, once with CMake's find_package(strata) and once with a
# Makefile using pkg-config. Prints PASS when all of them ran and trained
# (custom_mlp: the same losses in RAM and on NVMe, and falling).
set -eu
build="$1"
src="$2"
examples="$3"
work=$(mktemp -d "${STRATA_TEST_DIR:-/tmp}/strata-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
lib=$(dirname "$(find "$work/prefix" -name 'libstrata.so' | head -1)")
echo "installed: $(cd "$work/prefix" && find . -type f | sort | tr '\n' ' ')"
cmake -S "$src" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" -DSTRATA_EXAMPLES="$examples" >/dev/null
cmake --build "$work/cmake" >/dev/null
mkdir "$work/nvme"
# (captured first: a failing run fails the script, which a pipe would hide)
out=$(LD_LIBRARY_PATH="$lib" "$work/cmake/custom_mlp" "$work/nvme")
echo "$out" | tail -n 1 | sed 's/^/find_package: custom_mlp: /'
LD_LIBRARY_PATH="$lib" "$work/cmake/consumer" | sed 's/^/find_package: /'
mkdir "$work/make"
cp "$src/consumer.c" "$src/Makefile" "$examples/custom_mlp.c" "$work/make/"
PKG_CONFIG_PATH="$lib/pkgconfig" make -s -C "$work/make" consumer custom_mlp
out=$(LD_LIBRARY_PATH="$lib" "$work/make/custom_mlp" "$work/nvme")
echo "$out" | tail -n 1 | sed 's/^/pkg-config: custom_mlp: /'
LD_LIBRARY_PATH="$lib" "$work/make/consumer" | sed 's/^/pkg-config: /'
# The Python package, where the build has one: imported from the prefix
# alone (its module finds the installed libstrata.so by its RPATH).
pkg=$(find "$work/prefix" -type d -path '*dist-packages/strata' | head -1)
if [ -n "$pkg" ]; then
  (cd "$work" && PYTHONPATH=$(dirname "$pkg") /usr/bin/python3 -c '
import strata, strata.optim, numpy as np
assert strata.__file__.startswith("'"$work"'/prefix"), strata.__file__
assert strata.__version__ == strata.library_version()
t = strata.Trainer({"model": {"layers": 1, "hidden": 32, "heads": 1, "vocab": 256, "max_seq": 16},
                    "batch": {"micro_batch": 2, "seq": 16}})
loss = t.step()
p = np.ones(8, np.float32); m = np.zeros(8, np.float32); v = np.zeros(8, np.float32)
strata.optim.adamw_step(p, np.ones(8, np.float32), m, v, step=1)
print("python: strata", strata.__version__, "from the prefix; a step, loss %.3f" % loss)')
fi
echo PASS
