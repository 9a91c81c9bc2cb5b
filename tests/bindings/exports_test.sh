#!/bin/sh
# libstrata.so exports exactly the functions its headers declare, each under
# the version node bindings/libstrata.map gives it by name, and nothing
# else: a C++ symbol of the engine, an unversioned export, a function the
# map lists but the header does not (or the other way round) fails this,
# so no symbol lands or leaves silently. PASS, or each difference.
# Usage: exports_test.sh LIBSTRATA.SO INCLUDE_DIR LIBSTRATA.MAP
lib="$1" headers="$2" map="$3"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat "$headers"/*.h | sed -n 's/^STRATA_API [^(]*[ *]\(strata_[a-z_]*\)(.*/\1/p' | sort -u >"$dir/header"
# "symbol node" for each name the map lists under a node's global: part.
awk '
  /^[A-Z_0-9.]+ *\{/ { node = $1; sub(/\{.*/, "", node); global = 0; next }
  /global:/ { global = 1; next }
  /local:/ { global = 0; next }
  global && /^ *strata_[a-z_]+;/ { s = $1; sub(/;.*/, "", s); print s " " node }' "$map" | sort -u >"$dir/map"
objdump -T "$lib" | awk '
  $1 ~ /^[0-9a-f]+$/ && ($2 == "g" || $2 == "w") && $0 !~ /\*UND\*/ {
    ver = $(NF - 1); sym = $NF
    if (sym == ver) next  # the version node itself
    print sym " " ver }' | sort -u >"$dir/lib"
bad=0
[ -s "$dir/header" ] || { echo "no STRATA_API functions found in $headers"; bad=1; }
cut -d' ' -f1 "$dir/map" | sort -u >"$dir/map_names"
for f in $(comm -23 "$dir/header" "$dir/map_names"); do echo "in the headers, not in libstrata.map: $f"; bad=1; done
for f in $(comm -13 "$dir/header" "$dir/map_names"); do echo "in libstrata.map, not in the headers: $f"; bad=1; done
comm -23 "$dir/map" "$dir/lib" | while read -r sym node; do echo "not exported as $sym@$node: $sym"; done >"$dir/missing"
comm -13 "$dir/map" "$dir/lib" | while read -r sym node; do echo "unexpected export: $sym@$node"; done >"$dir/extra"
[ -s "$dir/missing" ] && { cat "$dir/missing"; bad=1; }
[ -s "$dir/extra" ] && { cat "$dir/extra"; bad=1; }
[ "$bad" -eq 0 ] && echo "$(wc -l <"$dir/lib") exports, each in its node" && echo PASS
exit "$bad"
