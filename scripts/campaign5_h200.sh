#!/usr/bin/env bash
# #18's three verified cp=1 max-N figures on one H200 (boltz2, kernels auto), each a probe to a
# granularity <= 512 with its verification re-runs.
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> [RESUME=<earlier call's probe dir>] bash scripts/campaign5_h200.sh CALL
# CALL t: trunk only (recycles 0), from N=1,024, predict + verify, inside this one call.
# CALL s: with sampling (boltz2 defaults: 3 recycles, 200 steps x 5 samples), same probe settings.
# CALL r: training (64 blocks, checkpointing, AdamW), from N=1,024 (growth 1.5), granularity 256.
# A probe that one call cannot finish stops at probe.budget_s (its points so far are in
# probe_state.json); RESUME=<that probe's folder, carried in the tree> continues it in the next
# call with the same overrides and the same commit (both are the probe's signature).
set -u
CALL=${1:?call name}
OUT=${OUT:?set OUT}
BUDGET_S=${BUDGET_S:-580}
START=$(date +%s)
mkdir -p "$OUT"
source scripts/gpu_env.sh > "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt"; exit 1; }
cat "$OUT/env.txt"
cat commit.txt > "$OUT/commit.txt" 2>/dev/null || true
nvidia-smi > "$OUT/nvidia-smi_before.txt" 2>&1

source scripts/campaign_lib.sh  # left, point, archive_out
PROBE="routine=probe cp=1 model=boltz2 probe.strategy=predict probe.verify=true probe.start=1024 probe.depth=1"

# probe NAME OVERRIDES...: one probe into $OUT/NAME (continuing $RESUME when set), then its points
probe() {
  local name=$1; shift
  if [ -n "${RESUME:-}" ]; then cp -r "$RESUME" "$OUT/$name" && rm -f "$OUT/$name/result.json"; fi
  point "$name" 60 "$@"
  grep -h "probe N=\|predicted\|verify\|depth check\|continuing" "$OUT/$name.log" | cut -c1-400
}

case "$CALL" in
  t) probe trunk_cp1 $PROBE workflow.sampling=false workflow.recycles=0 probe.granularity=512 \
       probe.timeout_s=250 probe.budget_s=500 ;;
  s) probe sampling_cp1 $PROBE probe.granularity=512 probe.timeout_s=330 probe.budget_s=300 ;;
  r) probe training_cp1 $PROBE workflow=training probe.growth=1.5 probe.granularity=256 \
       probe.timeout_s=330 probe.budget_s=300 ;;
  *) echo "unknown call $CALL"; exit 2 ;;
esac
nvidia-smi > "$OUT/nvidia-smi_after.txt" 2>&1
archive_out
