#!/usr/bin/env bash
# #18's three verified cp=1 max-N figures on one H200 (boltz2, kernels auto), each a probe to a
# granularity <= 512 with its verification re-runs.
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> [RESUME=<earlier call's probe dir>] bash scripts/campaign5_h200.sh CALL
# CALL t: trunk only (recycles 0), from N=1,024, predict + verify, inside this one call.
# CALL s: with sampling (boltz2 defaults: 3 recycles, 200 steps x 5 samples), same probe settings.
# CALL r: training (64 blocks, checkpointing, AdamW; every point at full depth), from N=2,560 (the
#         earlier sessions' one fitting point) with growth 1.1 and granularity 256: a training point
#         near the limit takes ~265 s, so a ramp from 1,024 and a prediction do not fit two calls.
# CALL f: #17 side by side after the chunk-budget change: the 64-block trunk pass at N=2,048 and
#         N=512, kernels=flex then kernels=torch (while the call's time lasts).
# CALL p: where a short step's host time goes (scripts/step_overhead.py, N=512, flex and torch).
# Several calls run in order: bash scripts/campaign5_h200.sh "r f".
# A probe that one call cannot finish stops at probe.budget_s (its points so far are in
# probe_state.json); RESUME=<that probe's folder, carried in the tree> continues it in the next
# call with the same overrides and the same commit (both are the probe's signature; its limits,
# probe.budget_s and probe.max_points, are not: R_BUDGET_S sets call r's).
set -u
CALLS=${1:?call name(s)}
source scripts/campaign_lib.sh  # campaign_begin, left, point, probe, script_phase, archive_out, campaign_end
campaign_begin 580
PROBE="routine=probe cp=1 model=boltz2 probe.verify=true"
PREDICT="$PROBE probe.strategy=predict probe.start=1024 probe.depth=1"
TRUNK="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing cp=1"

for CALL in $CALLS; do
  case "$CALL" in
    t) probe trunk_cp1 $PREDICT workflow.sampling=false workflow.recycles=0 probe.granularity=512 \
         probe.timeout_s=250 probe.budget_s=500 ;;
    s) probe sampling_cp1 $PREDICT probe.granularity=512 probe.timeout_s=330 probe.budget_s=300 ;;
    r) probe training_cp1 $PROBE workflow=training probe.strategy=bisect probe.start=2560 probe.growth=1.1 \
         probe.granularity=256 probe.timeout_s=330 probe.budget_s=${R_BUDGET_S:-300} ;;
    f) point trunk2048_flex 150 $TRUNK N=2048 model.kernels=flex timing.timeout_s=200
       point trunk2048_torch 130 $TRUNK N=2048 model.kernels=torch timing.timeout_s=150
       point trunk512_flex 60 $TRUNK N=512 model.kernels=flex timing.timeout_s=90
       point trunk512_torch 45 $TRUNK N=512 model.kernels=torch timing.timeout_s=60 ;;
    p) script_phase step_overhead_512 python3 scripts/step_overhead.py --n 512 --kernels flex torch \
         --out "$OUT/step_overhead_512.json" ;;
    *) echo "unknown call $CALL"; exit 2 ;;
  esac
done
campaign_end
