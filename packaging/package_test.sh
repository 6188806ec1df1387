#!/usr/bin/env bash
# The checks of a built bundle, run by `make package-test` after `make package` (which has
# already run `Outrider --check-bundle`). Linux and macOS; each step stops the script on failure.
#
#   1. the frozen self-test, offscreen, on the default model and the tiny fixtures that
#      packaging/self_test_fixtures.py writes (app/self_test lists its checks);
#   2. tests/packaging: a copy of the bundle without llguidance's metadata fails the check,
#      the bundle itself passes;
#   3. the frozen server: structured output and a forced tool call over HTTP
#      (packaging/check_frozen_server.py).
#
#   PY=.venv/bin/python bash packaging/package_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
APP=${APP:-dist/Outrider/Outrider}
FIXTURES=build/self-test-fixtures
export QT_QPA_PLATFORM=offscreen
LIMIT=$(command -v timeout >/dev/null && echo "timeout -s ABRT" || true)

[ -x "$APP" ] || { echo "package_test: no $APP: run make package first" >&2; exit 1; }
MODEL=$("$PY" -m runtime.library.default_model)

step() { echo; echo "== [${SECONDS}s] $*"; }

step "frozen self-test ($APP --self-test): every check, one line each"
"$PY" packaging/self_test_fixtures.py "$FIXTURES"  # tiny models written with the checkout's gguf
args=(--self-test --model "$MODEL" --fixtures "$FIXTURES")
${LIMIT:+$LIMIT 900} "$APP" "${args[@]}"

step "tests/packaging (the bundle check fails without a dependency's metadata)"
${LIMIT:+$LIMIT 600} "$PY" -m pytest -q -p no:cacheprovider tests/packaging

step "frozen server ($APP --engine serve): structured output and tool calls"
${LIMIT:+$LIMIT 600} "$PY" packaging/check_frozen_server.py --app "$APP" --model "$MODEL"

echo
echo "package_test: all passed in ${SECONDS}s"
