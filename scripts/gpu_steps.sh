# shellcheck shell=bash
# The steps of scripts/gpu_check.sh under one overall deadline (sourced; tests/backends/test_gpu_scripts.py sources
# it too). The caller sets OUT (the folder of summary.txt), calls `steps_begin SECONDS` when the check begins, and
# defines each step as a shell function:
#
#   run_step [--optional] NAME LIMIT FUNCTION
#
# runs FUNCTION in a bash of its own (pipefail on; it sees exported variables and functions) for at most LIMIT
# seconds and never past the deadline: a step that would start with less than a second left is not started
# ("SKIPPED (deadline) NAME" in summary.txt), one still running at the deadline is stopped with everything it
# started (`timeout` signals its process group). STEP_DEADLINE_AT (seconds since the epoch) tells the step when it
# will be stopped. A required step that fails, times out or is skipped fails the check (FAILED=1); an optional one
# (the rows after the checks) that the deadline skips or stops does not. The clock is in milliseconds, so that a
# step stopped at the deadline is never followed by one that starts.
FAILED=0
now_ms() {
  if [ -n "${EPOCHREALTIME:-}" ]; then local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); else date +%s%3N; fi
}
steps_begin() { STEPS_START_MS=$(now_ms); STEPS_DEADLINE_MS=$((STEPS_START_MS + 1000 * $1)); }
elapsed() { echo $((($(now_ms) - STEPS_START_MS) / 1000)); }
step() { echo "== [$(elapsed) s] $*"; }
result() { # NAME STATUS: one summary line; a nonzero status fails the check
  if [ "$2" -eq 0 ]; then echo "PASS $1" >>"$OUT/summary.txt"; else echo "FAIL $1 (status $2)" >>"$OUT/summary.txt"; FAILED=1; fi
}
run_step() {
  local optional=0
  if [ "$1" = "--optional" ]; then optional=1; shift; fi
  local name=$1 limit_ms=$(($2 * 1000)) fn=$3 left_ms clipped=0
  left_ms=$((STEPS_DEADLINE_MS - $(now_ms)))
  if [ "$left_ms" -lt 1000 ]; then
    echo "SKIPPED (deadline) $name" >>"$OUT/summary.txt"
    echo "== [$(elapsed) s] SKIPPED (deadline) $name"
    [ "$optional" = 1 ] || FAILED=1
    return 0
  fi
  if [ "$limit_ms" -ge "$left_ms" ]; then limit_ms=$left_ms; clipped=1; fi
  local limit
  limit=$(printf '%d.%03d' $((limit_ms / 1000)) $((limit_ms % 1000)))
  step "$name (at most $limit s)"
  export -f "$fn"
  export STEP_DEADLINE_AT=$((($(now_ms) + limit_ms) / 1000))
  timeout -k 10 "$limit" bash -o pipefail -c "$fn"
  local status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    if [ "$clipped" = 0 ]; then
      echo "FAIL $name (timed out after $2 s)" >>"$OUT/summary.txt"
      FAILED=1
    elif [ "$optional" = 1 ]; then
      echo "SKIPPED (deadline) $name (stopped after $((limit_ms / 1000)) s)" >>"$OUT/summary.txt"
    else
      echo "FAIL $name (stopped by the deadline after $((limit_ms / 1000)) s)" >>"$OUT/summary.txt"
      FAILED=1
    fi
  else
    result "$name" "$status"
  fi
  return 0
}
