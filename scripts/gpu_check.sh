#!/usr/bin/env bash
# One device call: install tilefly, run the GPU tests and the named benchmark
# suites, and leave logs and JSON under $OUT (default ./gpu_out).
#
#   COMMIT=<sha> scripts/gpu_check.sh [--tests PYTEST_SELECTION] [--bench "SUITE ..."] [--quick]
#                                     [--run "SHELL COMMAND"] [--no-tests] [--step-limit SECONDS]
#                                     [--jobs N] [--rounds N] [--headstart-us US] [--no-install]
#
# The device's copy of the tree has no .git: pass the commit being measured in
# COMMIT so the benchmark JSON records it. Example (the first call of a session):
#   COMMIT=$(git rev-parse --short HEAD) scripts/gpu_check.sh --bench "rmsnorm topk" --quick
#
# The device returns at most 8 files from $OUT, so everything (test logs, each
# suite's Markdown, JSON and PNG) lands in $OUT/results.tgz beside the summary log.
# The archive is rewritten after every step and each step runs under
# `timeout --step-limit` (default 300 s), so a call that runs past the device's
# limit still brings back everything finished before it.
# To measure exactly a commit while the working tree changes, run from a worktree of it:
#   git worktree add --detach .snap <commit>   (ignored; name it in the device call's carry)
#   cd .snap && COMMIT=<commit> scripts/gpu_check.sh ...
# --jobs N spreads the GPU tests over N pytest-xdist workers (the device image
# has pytest-xdist): the GPU tests are bound by Gluon/Triton compiles on the
# CPU, so eight workers cut the whole suite to a fraction of its serial time.
# --rounds N times each case's providers in turn, N rounds (python -m tilefly bench --rounds).
# --headstart-us US holds the GPU US µs after each L2 flush (python -m tilefly bench --headstart-us).
# --no-install skips the editable install: for a second instance started beside a first one that
# installs (e.g. one per GPU on a two-GPU machine, CUDA_VISIBLE_DEVICES and OUT set apart).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/bench"
export WORK  # --run commands write their files under $WORK
export PYTHONUNBUFFERED=1
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
TESTS="tests"; BENCH=""; QUICK=""; RUN=(); STEP_LIMIT=300; JOBS=1; ROUNDS=1; HEADSTART=0; INSTALL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) TESTS="$2"; shift 2 ;;
    --no-tests) TESTS=""; shift ;;
    --bench) BENCH="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    --run) RUN+=("$2"); shift 2 ;;
    --step-limit) STEP_LIMIT="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --headstart-us) HEADSTART="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
LOG="$OUT/gpu_check.log"
say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
pack() { cp "$LOG" "$WORK/"; tar czf "$OUT/results.tgz.part" -C "$WORK" . 2>/dev/null && mv "$OUT/results.tgz.part" "$OUT/results.tgz"; }
step() { timeout --kill-after=10 "$STEP_LIMIT" "$@"; local rc=$?; [ $rc -eq 124 ] && echo "(step stopped after ${STEP_LIMIT} s)" | tee -a "$LOG"; return $rc; }

if [ "$INSTALL" = 1 ]; then
  say "install"
  python3 -m pip install -e . --no-deps --no-build-isolation -q >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log" | tee -a "$LOG"; exit 1; }
fi
python3 -m tilefly doctor 2>&1 | tee "$WORK/doctor.txt" | head -12 | tee -a "$LOG"
python3 scripts/router_overhead.py --ops --json "$WORK/router_overhead.json" 2>&1 | tee -a "$LOG"
pack

if [ -n "$TESTS" ]; then
  say "GPU tests: $TESTS"
  XDIST=(); [ "$JOBS" -gt 1 ] && XDIST=(-n "$JOBS")
  # -v names every test as it ends and the failures file keeps each failure's report as it
  # happens: a step stopped by --step-limit never prints pytest's summary
  TILEFLY_TEST_FAILURES="$WORK/gpu_test_failures.txt" \
    step python3 -m pytest -v -rfE -m cuda -p no:cacheprovider "${XDIST[@]}" $TESTS >"$WORK/gpu_tests.log" 2>&1
  echo "pytest exit $?" >>"$WORK/gpu_tests.log"
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)|pytest exit|step stopped" "$WORK/gpu_tests.log" | tail -40 | tee -a "$LOG"
  [ -f "$WORK/gpu_test_failures.txt" ] && grep "^==== " "$WORK/gpu_test_failures.txt" | tee -a "$LOG"
  pack
fi

for cmd in "${RUN[@]}"; do
  say "run: $cmd"
  step bash -c "$cmd" 2>&1 | tee -a "$WORK/run.log" | tail -60 | tee -a "$LOG"
  pack
done

for suite in $BENCH; do
  say "bench $suite $QUICK"
  step python3 -m tilefly bench --suite "$suite" $QUICK --rounds "$ROUNDS" --headstart-us "$HEADSTART" --commit "$COMMIT" --out "$WORK/bench" >"$WORK/bench/$suite.md.log" 2>&1
  echo "bench exit $?" >>"$WORK/bench/$suite.md.log"
  cat "$WORK/bench/$suite.md.log" | grep -v "it/s\]" | tail -80 >>"$LOG"
  pack
done

say "done"
pack
