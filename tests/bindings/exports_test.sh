#!/bin/sh
# libstrata.so defines in its dynamic symbol table only the strata_*
# functions, each under the version node STRATA_0 (bindings/libstrata.map),
# and the node itself. Prints each other export and fails; PASS otherwise.
lib="$1"
objdump -T "$lib" | awk '
  $1 ~ /^[0-9a-f]+$/ && ($2 == "g" || $2 == "w") && $0 !~ /\*UND\*/ {
    ver = $(NF - 1); sym = $NF
    if (ver == "STRATA_0" && (sym == "STRATA_0" || sym ~ /^strata_/)) { n++; next }
    print "unexpected export: " $0; bad = 1
  }
  END { if (n < 10) { print "only " n " strata exports"; bad = 1 }; exit bad }' || exit 1
echo PASS
