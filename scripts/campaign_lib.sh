# Shared by the GPU campaign scripts (campaign3-7_h200.sh, campaign_stock_h200.sh): source it, then
# `campaign_begin DEFAULT_BUDGET_S` (or set OUT, BUDGET_S and START yourself, as the stock script
# does) and end with `campaign_end`. OUT: the call's output folder; BUDGET_S: seconds the call may
# take; START: its start (date +%s); PYTHON (default python3) runs cpbench.

# campaign_begin DEFAULT_BUDGET_S: checks OUT, takes BUDGET_S from the environment or the default,
# starts the clock and runs gpu_setup.
campaign_begin() {
  OUT=${OUT:?set OUT}
  BUDGET_S=${BUDGET_S:-$1}
  START=$(date +%s)
  gpu_setup
}

# campaign_end: nvidia-smi after the call, and the archive of $OUT.
campaign_end() {
  nvidia-smi > "$OUT/nvidia-smi_after.txt" 2>&1
  archive_out
}

# On the GPU machine, a call's preamble: $OUT, the carried wheels (scripts/gpu_env.sh, its output
# in $OUT/env.txt; a failure ends the call), the commit that runs, and nvidia-smi before.
gpu_setup() {
  mkdir -p "$OUT"
  source scripts/gpu_env.sh > "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt"; exit 1; }
  cat "$OUT/env.txt"
  cat commit.txt > "$OUT/commit.txt" 2>/dev/null || true
  # the snapshot has no .git of its own: its commit goes into every result.json's env.git_commit
  if [ -f commit.txt ]; then export CPBENCH_GIT_COMMIT=$(cat commit.txt); fi
  nvidia-smi > "$OUT/nvidia-smi_before.txt" 2>&1
}

# Seconds left of the call's budget.
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# point NAME NEEDED_S OVERRIDES...: one cpbench job into $OUT/NAME when NEEDED_S remain, killed
# 5 s before the budget ends (its supervisor then stops its workers, and the archive still runs).
point() {
  local name=$1 need=$2; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left) s left, needs $need"; return; fi
  local t0=$(date +%s)
  timeout $(( $(left) - 5 )) ${PYTHON:-python3} -m cpbench "$@" hydra.run.dir="$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "phase $name rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/$name.log" | cut -c1-600)"
}

# probe NAME OVERRIDES...: one probe into $OUT/NAME (continuing $RESUME, an earlier call's probe
# folder carried in the tree, when set), then its points
probe() {
  local name=$1; shift
  if [ -n "${RESUME:-}" ]; then cp -r "$RESUME" "$OUT/$name" && rm -f "$OUT/$name/result.json"; fi
  point "$name" 60 "$@"
  grep -h "probe N=\|predicted\|verify\|depth check\|continuing" "$OUT/$name.log" | cut -c1-400
}

# script_phase NAME COMMAND...: a diagnostic script when more than 60 s remain, killed 5 s before
# the budget ends, its output in $OUT/NAME.log; prints its JSON lines.
script_phase() {
  local name=$1; shift
  if [ "$(left)" -le 60 ]; then echo "skip $name: $(left) s left"; return; fi
  local t0=$(date +%s)
  timeout $(( $(left) - 5 )) "$@" > "$OUT/$name.log" 2>&1
  echo "phase $name rc=$? $(( $(date +%s) - t0 )) s"; grep '^{' "$OUT/$name.log"
}

# Only a few files of a call come back from the GPU machine: everything also goes into one archive.
archive_out() {
  tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$OUT.tgz" "$OUT/all.tgz"
  echo "done in $(( $(date +%s) - START )) s"
}
