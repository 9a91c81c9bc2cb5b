#!/bin/sh
# Each C API header has its reference page, and each page has an entry (a
# "### " heading naming it) for every function its header exports and
# names none it does not. PASS or the differences.
# Usage: c_api_doc_test.sh HEADER PAGE [HEADER PAGE ...]
bad=0
while [ $# -ge 2 ]; do
  header="$1" doc="$2"
  shift 2
  fns=$(sed -n 's/^STRATA_API [^(]*[ *]\(strata_[a-z_]*\)(.*/\1/p' "$header" | sort -u)
  documented=$(grep '^### ' "$doc" | grep -o 'strata_[a-z_]*' | sort -u)
  [ -n "$fns" ] || { echo "no STRATA_API functions found in $header"; bad=1; continue; }
  missing=$(printf '%s\n' "$fns" | grep -vxF "$documented")
  extra=$(printf '%s\n' "$documented" | grep -vxF "$fns")
  [ -z "$missing" ] || { echo "in $header, no entry in $doc: $missing"; bad=1; }
  [ -z "$extra" ] || { echo "in $doc, not in $header: $extra"; bad=1; }
done
[ "$bad" -eq 0 ] && echo PASS
exit "$bad"
