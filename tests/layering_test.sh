#!/bin/sh
# The layers' dependencies point down only: every `#include "DIR/..."` in
# a layer names that layer or one it may use (the table below, the
# layering of docs/ARCHITECTURE.md), no two parts include each other, and
# engine/ and gpu/ name no model in their code. A file that includes upward fails this with its path and line.
# PASS, or each offending include. Usage: layering_test.sh SOURCE_DIR
root="$1"
cd "$root" || exit 1
# layer: the layers it may include (besides itself)
allowed() {
  case "$1" in
    common) echo "" ;;
    io | cpu_optim | gpu) echo "common" ;;
    engine) echo "common io cpu_optim gpu" ;;
    models) echo "common io cpu_optim gpu engine" ;;
    bindings) echo "common io cpu_optim gpu engine models strata" ;;
    tools) echo "common io cpu_optim gpu engine models bench" ;;
    bench) echo "common io cpu_optim gpu engine models bench" ;;
  esac
}
bad=0
checked=0
for layer in common io cpu_optim gpu engine models bindings tools bench; do
  ok="$layer $(allowed "$layer")"
  for f in $(find "$layer" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \)); do
    checked=$((checked + 1))
    grep -n '^#include "[a-z_]*/' "$f" | while IFS= read -r line; do
      dir=$(printf '%s\n' "$line" | sed 's/^[0-9]*:#include "\([a-z_]*\)\/.*/\1/')
      case " $ok " in
        *" $dir "*) ;;
        *) echo "$f:${line%%:*}: $layer/ includes $dir/ (a layer above it or beside it)" ;;
      esac
    done
  done
done >"${TMPDIR:-/tmp}/layering.$$"
if [ -s "${TMPDIR:-/tmp}/layering.$$" ]; then
  cat "${TMPDIR:-/tmp}/layering.$$"
  bad=1
fi
rm -f "${TMPDIR:-/tmp}/layering.$$"
# No two parts of the tree include each other, even through others: a
# part is a header with its sources (plan.h with plan.cpp), and what its
# files include are its edges; tsort names the parts of any loop.
for layer in common io cpu_optim gpu engine models bindings tools bench; do
  find "$layer" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.c' -o -name '*.cu' -o -name '*.cuh' \)
done | while IFS= read -r f; do
  grep -o '^#include "[a-z_]*/[^"]*"' "$f" | sed 's/^#include "\(.*\)\.[a-z]*"$/\1/' | while IFS= read -r dep; do
    [ "$dep" = "${f%.*}" ] || echo "${f%.*} $dep"
  done
done >"${TMPDIR:-/tmp}/layering-edges.$$"
if ! tsort "${TMPDIR:-/tmp}/layering-edges.$$" >/dev/null 2>"${TMPDIR:-/tmp}/layering-loop.$$"; then
  sed -e 's/^tsort: [^:]*: input/input/' -e 's/^tsort: /  /' "${TMPDIR:-/tmp}/layering-loop.$$"
  echo "parts of the tree that include each other (above)"
  bad=1
fi
rm -f "${TMPDIR:-/tmp}/layering-edges.$$" "${TMPDIR:-/tmp}/layering-loop.$$"
# engine/ and gpu/ are model-agnostic: no model's types or headers in
# their code (comments may point at the built-in GPT as an example).
if grep -rnE '^[^/]*\b(Gpt[A-Za-z]*|gpt_[a-z_]+)\b' engine gpu --include='*.h' --include='*.cpp' --include='*.cu' \
  --include='*.cuh' | grep -v '^\S*: *//'; then
  echo "engine/ or gpu/ names a model in its code (above)"
  bad=1
fi
[ "$checked" -gt 50 ] || { echo "only $checked files checked"; bad=1; }
[ "$bad" -eq 0 ] && echo "$checked files, every include points down" && echo PASS
exit "$bad"
