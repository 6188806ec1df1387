#!/usr/bin/env bash
# The GUI tests under load, for crashes that come one run in a few (issue 45's acceptance):
# a busy loop on every core for the whole run, then each GUI test file that uses
# BackgroundRunner or Inbox RUNS times, then the whole GUI tier TIERS times in a row (one file
# per process, as `make test` runs it). A run killed by a signal counts as a crash; any crash
# or failure makes the exit status non-zero. About 90 minutes on 2 cores with the defaults.
#
#   bash tests/gui/soak.sh [RUNS=30] [TIERS=3]        # after `make test` has set up .venv
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
RUNS=${1:-30}
TIERS=${2:-3}
export QT_QPA_PLATFORM=offscreen
LOG=${SOAK_LOG:-build/soak}
mkdir -p "$LOG"

busy=()
for _ in $(seq "$(nproc)"); do
    sh -c 'while :; do :; done' &
    busy+=($!)
done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT

crashes=0 failures=0 runs=0
run_file() {  # run_file FILE TAG
    local out="$LOG/$(basename "$1" .py).$2.log" rc
    timeout -s ABRT 600 "$PY" -m pytest -q -p no:cacheprovider "$1" >"$out" 2>&1
    rc=$?
    runs=$((runs + 1))
    if [ "$rc" -ge 124 ]; then  # a signal (SIGSEGV 139, SIGABRT 134) or the time limit
        crashes=$((crashes + 1)); echo "CRASH rc=$rc $1 ($out)"; grep -m3 -E "Fatal|malloc|corrupt" "$out"
    elif [ "$rc" -ne 0 ]; then
        failures=$((failures + 1)); echo "FAIL rc=$rc $1 ($out)"
    fi
}

files=$(grep -l -E "BackgroundRunner|Inbox|background_stress" tests/gui/test_*.py)
for f in $files; do
    for i in $(seq "$RUNS"); do run_file "$f" "$i"; done
    echo "$(date +%T) $f: $RUNS runs under load"
done
for t in $(seq "$TIERS"); do
    for f in tests/gui/test_*.py; do run_file "$f" "tier$t"; done
    echo "$(date +%T) GUI tier, pass $t of $TIERS"
done
echo "soak: $runs runs, $crashes crashes, $failures failures"
[ "$crashes" -eq 0 ] && [ "$failures" -eq 0 ]
