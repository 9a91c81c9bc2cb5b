#!/bin/sh
# Installs strata from BUILD_DIR into a fresh prefix, then builds and runs
# the consumer of tests/install/consumer against that prefix alone, once
# with CMake's find_package(strata) and once with a Makefile using
# pkg-config. Prints PASS when both ran and trained.
set -eu
build="$1"
src="$2"
work=$(mktemp -d "${STRATA_TEST_DIR:-/tmp}/strata-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
lib=$(dirname "$(find "$work/prefix" -name 'libstrata.so' | head -1)")
echo "installed: $(cd "$work/prefix" && find . -type f | sort | tr '\n' ' ')"
cmake -S "$src" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cmake" >/dev/null
LD_LIBRARY_PATH="$lib" "$work/cmake/consumer" | sed 's/^/find_package: /'
mkdir "$work/make"
cp "$src/consumer.c" "$src/Makefile" "$work/make/"
PKG_CONFIG_PATH="$lib/pkgconfig" make -s -C "$work/make" consumer
LD_LIBRARY_PATH="$lib" "$work/make/consumer" | sed 's/^/pkg-config: /'
echo PASS
