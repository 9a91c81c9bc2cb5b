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
echo PASS
