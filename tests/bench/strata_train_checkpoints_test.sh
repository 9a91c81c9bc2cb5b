#!/bin/sh
# strata-train's checkpoints, end to end: --save-every N writes one checkpoint
# every N steps and the last step's once (not a second copy of the step just
# saved), and --keep-checkpoints N leaves the newest N; a resume at or past
# --steps runs nothing and writes nothing; and a
# resumed run prints the losses of the run that never stopped. Outputs
# written after the run (checkpoint, trace) with a path that cannot be
# written fail before the first step. SIGTERM stops a run after its step
# in progress with a checkpoint of that step, exit status 143 (with
# --stop-grace 0 it may cancel that step instead, the checkpoint then the
# step before). With --data
# (here a text file as uint8 tokens) a resumed run reads on where the
# uninterrupted one would have: the same losses. A second run on a
# checkpoint directory that a run is writing is refused at once.
# Usage: strata_train_checkpoints_test.sh path/to/strata-train path/to/a/text/file
set -eu
train=$1
text=$2
d=$(mktemp -d "${STRATA_TEST_DIR:-/tmp}/strata-train-ckpt.XXXXXX")
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# Waits until the run with pid $2 printed its third step into $1.
third_step() {
  waited=0
  until grep -q "^step *3 |" "$1"; do
    sleep 0.2
    waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { kill -9 "$2"; fail "no third step in 120 s"; }
  done
}

"$train" --steps 4 --checkpoint "$d/a" --save-every 2 > "$d/full.txt"
listing=$(ls "$d/a" | tr '\n' ' ')
[ "$listing" = "latest step-2 step-4 " ] || fail "--save-every 2 over 4 steps left: $listing"
"$train" --steps 4 --checkpoint "$d/k" --save-every 1 --keep-checkpoints 2 > /dev/null
listing=$(ls "$d/k" | tr '\n' ' ')
[ "$listing" = "latest step-3 step-4 " ] || fail "--keep-checkpoints 2 left: $listing"

"$train" --steps 3 --checkpoint "$d/a" --resume > "$d/past.txt"
grep -q "nothing to run: the checkpoint is at step 4, --steps asks for 3" "$d/past.txt" || fail "no 'nothing to run' line"
grep -q '"steps":0' "$d/past.txt" || fail "a run of no steps reports steps other than 0"
listing=$(ls "$d/a" | tr '\n' ' ')
[ "$listing" = "latest step-2 step-4 " ] || fail "a resume with nothing to run wrote: $listing"

# loss_of FILE STEP: the "loss X" field of that step's line.
loss_of() { grep "^step *$2 |" "$1" | cut -d'|' -f2; }
# resumes_alike LABEL FULL ARGS...: 2 steps, a checkpoint, a resume to 4;
# steps 3 and 4 as in FULL (the uninterrupted run's output).
resumes_alike() {
  label=$1 full=$2
  shift 2
  "$train" --steps 2 "$@" --checkpoint "$d/$label" > /dev/null
  "$train" --steps 4 "$@" --checkpoint "$d/$label" --resume > "$d/$label.txt"
  for step in 3 4; do
    want=$(loss_of "$full" "$step")
    got=$(loss_of "$d/$label.txt" "$step")
    [ -n "$want" ] && [ "$want" = "$got" ] || fail "$label step $step: uninterrupted '$want', resumed '$got'"
    echo "$label step $step:$got (uninterrupted:$want)"
  done
}
resumes_alike synthetic "$d/full.txt"
"$train" --steps 4 --data "$text" --data-type uint8 > "$d/data_full.txt"
grep -q "^data: $text, [0-9]* tokens (uint8)" "$d/data_full.txt" || fail "no 'data:' line"
resumes_alike data "$d/data_full.txt" --data "$text" --data-type uint8
[ "$(loss_of "$d/full.txt" 3)" != "$(loss_of "$d/data_full.txt" 3)" ] || fail "--data gave the synthetic losses"

for bad in "--checkpoint /proc/no-checkpoints-here" "--trace $d/missing/trace.json" "--data $d/no-such-tokens"; do
  # shellcheck disable=SC2086
  if "$train" --steps 3 $bad > "$d/bad.txt" 2>&1; then fail "$bad was accepted"; fi
  grep -q "^step " "$d/bad.txt" && fail "$bad failed only after training"
  echo "refused before the first step: $(tail -n 1 "$d/bad.txt")"
done
"$train" --steps 1000000 --checkpoint "$d/c" > "$d/term.txt" 2>&1 &
pid=$!
third_step "$d/term.txt" "$pid"
# A second run on the same checkpoint directory is refused before it
# builds anything, naming the first run's pid.
if "$train" --steps 2 --checkpoint "$d/c" > "$d/second.txt" 2>&1; then
  kill -9 "$pid"
  fail "a second writer of $d/c was accepted"
fi
grep -q "is being written by another writer (pid $pid," "$d/second.txt" ||
  { kill -9 "$pid"; fail "the second writer's refusal: $(tail -n 1 "$d/second.txt")"; }
grep -q "^step " "$d/second.txt" && { kill -9 "$pid"; fail "the second writer ran steps"; }
echo "a second writer refused: $(tail -n 1 "$d/second.txt")"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || fail "SIGTERM: exit status $rc, not 143"
stopped=$(sed -n 's/^stopping after step \([0-9]*\): SIGTERM, saving a checkpoint$/\1/p' "$d/term.txt")
[ -n "$stopped" ] || fail "no 'stopping after step N: SIGTERM' line"
[ "$(cat "$d/c/latest")" = "step-$stopped" ] || fail "latest is $(cat "$d/c/latest"), not step-$stopped"
grep -q "\"steps\":$stopped," "$d/term.txt" || fail "the summary does not report $stopped steps"
echo "SIGTERM after step $stopped: exit 143, checkpoint step-$stopped"
# With --stop-grace 0 a step in progress at the signal is cancelled before
# its next block (unless its last block had begun): the run stops with the
# step before it, saved. Either way the checkpoint is the last step done.
"$train" --steps 1000000 --checkpoint "$d/g" --stop-grace 0 > "$d/grace.txt" 2>&1 &
pid=$!
third_step "$d/grace.txt" "$pid"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || fail "SIGTERM with --stop-grace 0: exit status $rc, not 143"
line=$(grep "^stopping after step" "$d/grace.txt") || fail "no 'stopping after step N' line"
stopped=$(printf '%s\n' "$line" | sed -n 's/^stopping after step \([0-9]*\): SIGTERM.*, saving a checkpoint$/\1/p')
[ -n "$stopped" ] || fail "the stop line: $line"
case "$line" in
  *"in progress cancelled"*)
    printf '%s\n' "$line" | grep -q ", step $((stopped + 1)) in progress cancelled (not due to end within --stop-grace)" ||
      fail "the cancel names another step: $line" ;;
esac
[ "$(cat "$d/g/latest")" = "step-$stopped" ] || fail "latest is $(cat "$d/g/latest"), not step-$stopped"
grep -q "\"steps\":$stopped," "$d/grace.txt" || fail "the summary does not report $stopped steps"
echo "SIGTERM with --stop-grace 0: $line"
echo "PASS"
