#!/bin/sh
# docs/C_API.md has a reference entry (a "### " heading naming it) for
# every function strata.h exports, and names none it does not. PASS or the
# differences.
header="$1"
doc="$2"
fns=$(sed -n 's/^STRATA_API [^(]*[ *]\(strata_[a-z_]*\)(.*/\1/p' "$header" | sort -u)
documented=$(grep '^### ' "$doc" | grep -o 'strata_[a-z_]*' | sort -u)
[ -n "$fns" ] || { echo "no STRATA_API functions found in $header"; exit 1; }
missing=$(printf '%s\n' "$fns" | grep -vxF "$documented")
extra=$(printf '%s\n' "$documented" | grep -vxF "$fns")
[ -z "$missing" ] || echo "in strata.h, no entry in docs/C_API.md: $missing"
[ -z "$extra" ] || echo "in docs/C_API.md, not in strata.h: $extra"
[ -z "$missing$extra" ] && echo PASS
