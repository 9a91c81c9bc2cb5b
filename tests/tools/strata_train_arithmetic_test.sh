#!/bin/sh
# `strata train --data arithmetic`: a small model (examples/arithmetic.json,
# 2-digit additions, rows aligned to whole examples) reaches a held-out
# exact-match accuracy far above chance (1 in 1000: the answer has three
# digits); and `strata train` stopped with a checkpoint then `--resume`d gives
# the uninterrupted run's losses bit for bit (the summary's last_loss is the
# float's shortest exact form) on the same corpus.
# Usage: strata_train_arithmetic_test.sh path/to/strata path/to/examples/arithmetic.json
set -eu
strata=$1
config=$2
d=$(mktemp -d "${STRATA_TEST_DIR:-/tmp}/strata-arith.XXXXXX")
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
json_field() { tail -1 "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }

"$strata" train --config "$config" --data arithmetic --arithmetic-digits 2 > "$d/full.txt"
grep "held-out exact match" "$d/full.txt" || fail "no held-out accuracy line"
acc=$(json_field "$d/full.txt" held_out_accuracy)
python3 -c "import sys; sys.exit(0 if $acc >= 0.10 else 1)" || fail "held-out accuracy $acc, want >= 0.10 (chance 0.001)"

args="--config $config --data arithmetic --arithmetic-digits 2 --eval-examples 0"
"$strata" train $args --steps 12 > "$d/straight.txt"
"$strata" train $args --steps 6 --checkpoint "$d/ck" > /dev/null
"$strata" train $args --steps 12 --checkpoint "$d/ck" --resume > "$d/resumed.txt"
grep -q "resumed from $d/ck at step 6" "$d/resumed.txt" || fail "the resume did not start at step 6"
for s in 7 8 9 10 11 12; do
  a=$(grep "^step *$s |" "$d/straight.txt" | cut -d'|' -f2)
  b=$(grep "^step *$s |" "$d/resumed.txt" | cut -d'|' -f2)
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "step $s: loss '$a' straight, '$b' resumed"
done
a=$(json_field "$d/straight.txt" last_loss)
b=$(json_field "$d/resumed.txt" last_loss)
[ "$a" = "$b" ] || fail "last loss $a straight, $b resumed"
echo "held-out accuracy $acc; resumed losses equal, last $a"
echo PASS
