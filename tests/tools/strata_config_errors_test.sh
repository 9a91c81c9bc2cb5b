#!/bin/sh
# Bad flags and bad or inconsistent config files, through `strata plan`,
# `strata train` and `strata capacity`: each must exit non-zero (not killed
# by a signal, not hung: every run has a timeout) with exactly one error line
# on stderr that names the key, flag or path and what is allowed.
# Usage: strata_config_errors_test.sh STRATA_BINARY
set -u
strata="$1"
dir=$(mktemp -d /tmp/strata-config-errors.XXXXXX)
ro_mounted=
cleanup() {
  [ -n "$ro_mounted" ] && umount "$dir/ro" 2>/dev/null
  chmod -R u+w "$dir" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
failures=0
cases=0

# expect NAME EXPECTED_SUBSTRING COMMAND...: the command exits 1..123, and
# stderr holds exactly one line that is not a warning, containing the text.
expect() {
  name="$1" want="$2"
  shift 2
  cases=$((cases + 1))
  timeout 120 "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
  errors=$(grep -v ": warning: " "$dir/err")
  lines=$(printf '%s\n' "$errors" | grep -c .)
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAIL $name: exit status $rc (want 1..123)"
    failures=$((failures + 1))
  elif [ "$lines" -ne 1 ]; then
    echo "FAIL $name: $lines error lines (want one):"
    cat "$dir/err"
    failures=$((failures + 1))
  elif ! printf '%s\n' "$errors" | grep -qF -- "$want"; then
    echo "FAIL $name: the error does not say \"$want\": $errors"
    failures=$((failures + 1))
  else
    echo "ok   $name: $errors"
  fi
}

config() { printf '%s\n' "$2" >"$dir/$1.json"; }

config malformed '{ "batch": {"micro_batch": 2'
config top_level_array '[1, 2]'
config wrong_type '{"batch": {"micro_batch": "three"}}'
config wrong_type_budget '{"budgets": {"host": true}}'
config unknown_offload_device '{"zero_optimization": {"offload_optimizer": {"device": "tape"}}}'
config unknown_weights_tier '{"placement": {"weights": "floppy"}}'
config negative_budget '{"budgets": {"host": -5}}'
config negative_budget_text '{"budgets": {"device": "-1GiB"}}'
config inconsistent_batches '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}'
config heads_do_not_divide '{"model": {"hidden": 100, "heads": 7}}'
config nvme_missing "{\"nvme_paths\": [\"$dir/missing\"], \"placement\": {\"states\": \"nvme\"}}"
config nvme_without_dir '{"placement": {"states": "nvme"}}'

for sub in plan train; do
  expect "$sub malformed JSON" "malformed.json is not valid JSON" "$strata" $sub --config "$dir/malformed.json"
  expect "$sub top-level array" "JSON object" "$strata" $sub --config "$dir/top_level_array.json"
  expect "$sub wrong type" "batch.micro_batch: expected an integer" "$strata" $sub --config "$dir/wrong_type.json"
  expect "$sub wrong type budget" "budgets.host: expected a byte count" "$strata" $sub --config "$dir/wrong_type_budget.json"
  expect "$sub unknown offload device" "offload_optimizer.device: expected one of cpu, nvme, none" \
    "$strata" $sub --config "$dir/unknown_offload_device.json"
  expect "$sub unknown weights tier" "placement.weights" "$strata" $sub --config "$dir/unknown_weights_tier.json"
  expect "$sub negative budget" "budgets.host: expected a byte count" "$strata" $sub --config "$dir/negative_budget.json"
  expect "$sub negative budget text" "budgets.device" "$strata" $sub --config "$dir/negative_budget_text.json"
  expect "$sub inconsistent batches" "train_batch_size: 10 is not a multiple" \
    "$strata" $sub --config "$dir/inconsistent_batches.json"
  expect "$sub heads" "heads" "$strata" $sub --config "$dir/heads_do_not_divide.json"
  expect "$sub missing NVMe directory" "$dir/missing" "$strata" $sub --config "$dir/nvme_missing.json"
  expect "$sub NVMe placement without a directory" "needs nvme_paths" "$strata" $sub --config "$dir/nvme_without_dir.json"
  expect "$sub missing config file" "$dir/absent.json" "$strata" $sub --config "$dir/absent.json"
done

# A config path that is not a readable file: a directory (this aborted on
# an uncaught exception), an empty file, a FIFO (which would block a reader).
mkdir "$dir/a_directory"
: >"$dir/empty.json"
mkfifo "$dir/fifo.json"
for sub in plan train; do
  expect "$sub config is a directory" "$dir/a_directory is a directory" "$strata" $sub --config "$dir/a_directory"
  expect "$sub config is empty" "$dir/empty.json is empty" "$strata" $sub --config "$dir/empty.json"
  expect "$sub config is a FIFO" "$dir/fifo.json is a FIFO" "$strata" $sub --config "$dir/fifo.json"
done
expect "train --data is a directory" "token file $dir/a_directory is a directory" \
  "$strata" train --steps 1 --data "$dir/a_directory"
expect "capacity --json in a missing directory" "$dir/missing" \
  "$strata" capacity --plan-only --json "$dir/missing/out.json"

# The device budget in the default (resident) placement: the planner's
# refusal is the run's, before any step (it trained past the budget, exit 0).
config tiny_device '{"model": {"layers": 2, "hidden": 64, "heads": 2, "vocab": 256, "max_seq": 32},
  "batch": {"micro_batch": 2, "seq": 32}, "budgets": {"device": "64KiB"}, "steps": 1}'
cases=$((cases + 1))
timeout 120 "$strata" train --config "$dir/tiny_device.json" >"$dir/out" 2>"$dir/err"
rc=$?
if [ "$rc" -ne 1 ] || ! grep -qF "does not fit the budgets" "$dir/err" || grep -q "^step " "$dir/out"; then
  echo "FAIL train over the device budget: exit status $rc (want 1, no step):"
  cat "$dir/err"
  failures=$((failures + 1))
else
  echo "ok   train over the device budget: $(tail -n 1 "$dir/err")"
fi

# The planner alone, for a drive this machine does not have: with the NVMe
# budget given, a missing NVMe directory is only a name (a run refuses it).
config plan_elsewhere "{\"nvme_paths\": [\"$dir/missing\"], \"budgets\": {\"nvme\": \"8GiB\"},
  \"placement\": {\"states\": \"nvme\"}}"
cases=$((cases + 1))
if timeout 120 "$strata" plan --config "$dir/plan_elsewhere.json" >"$dir/out" 2>"$dir/err" &&
  grep -q "plan only: fits the budgets" "$dir/out"; then
  echo "ok   plan for a missing NVMe directory with its budget given"
else
  echo "FAIL plan for a missing NVMe directory with its budget given:"
  cat "$dir/err"
  failures=$((failures + 1))
fi
expect "train for a missing NVMe directory with its budget given" "$dir/missing" \
  "$strata" train --config "$dir/plan_elsewhere.json" --steps 1

# An NVMe directory on tmpfs (no O_DIRECT), where the machine has one.
shm=
for d in /dev/shm /run/shm; do
  if [ -d "$d" ] && [ "$(stat -f -c %T "$d" 2>/dev/null)" = tmpfs ] && [ -w "$d" ]; then shm="$d"; break; fi
done
if [ -n "$shm" ]; then
  config nvme_tmpfs "{\"nvme_paths\": [\"$shm\"], \"placement\": {\"states\": \"nvme\"}}"
  expect "plan NVMe directory on tmpfs" "does not support O_DIRECT" "$strata" plan --config "$dir/nvme_tmpfs.json"
  expect "train NVMe directory on tmpfs" "does not support O_DIRECT" "$strata" train --config "$dir/nvme_tmpfs.json"
  expect "capacity --nvme on tmpfs" "does not support O_DIRECT" "$strata" capacity --plan-only --nvme "$shm"
else
  echo "skip NVMe directory on tmpfs: no writable tmpfs at /dev/shm or /run/shm"
fi

# A read-only NVMe directory: a read-only bind mount as root (root writes
# through permission bits), else a directory without write permission.
mkdir "$dir/ro"
if [ "$(id -u)" -eq 0 ]; then
  if mount --bind "$dir/ro" "$dir/ro" 2>/dev/null && mount -o remount,bind,ro "$dir/ro" 2>/dev/null; then
    ro_mounted=1
  fi
else
  chmod 555 "$dir/ro"
fi
if [ -n "$ro_mounted" ] || [ "$(id -u)" -ne 0 ]; then
  config nvme_read_only "{\"nvme_paths\": [\"$dir/ro\"], \"placement\": {\"states\": \"nvme\"}}"
  expect "plan read-only NVMe directory" "cannot create files in $dir/ro" "$strata" plan --config "$dir/nvme_read_only.json"
  expect "train read-only NVMe directory" "cannot create files in $dir/ro" \
    "$strata" train --config "$dir/nvme_read_only.json"
  expect "train --nvme read-only" "cannot create files in $dir/ro" "$strata" train --nvme "$dir/ro" --steps 1
  expect "capacity --nvme read-only" "cannot create files in $dir/ro" "$strata" capacity --plan-only --nvme "$dir/ro"
else
  echo "skip read-only NVMe directory: root could not bind-mount one read-only"
fi

# Bad flags.
expect "train --steps not a number" "--steps" "$strata" train --steps lots
expect "train --steps negative" "--steps" "$strata" train --steps -5
expect "train unknown flag" "--warp-speed" "$strata" train --warp-speed
expect "train unknown device" "--device" "$strata" train --device tpu
expect "capacity negative device budget" "--device-budget" "$strata" capacity --plan-only --device-budget -1GiB
expect "capacity unknown mode" "--modes" "$strata" capacity --plan-only --modes 7
expect "capacity zero steps" "--steps" "$strata" capacity --plan-only --steps 0
expect "capacity missing NVMe directory" "$dir/missing" "$strata" capacity --plan-only --nvme "$dir/missing"
expect "unknown subcommand" "fly" "$strata" fly

echo "$cases cases, $failures failed"
[ "$failures" -eq 0 ] && echo PASS
