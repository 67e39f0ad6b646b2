#!/usr/bin/env bash
# The eighth device session's calls on one H200 (docs/perf_notes.md, "Eighth device session").
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> BUDGET_S=<s> bash scripts/campaign6_h200.sh CALL...
# CALL d: diagnosis. #17's N=512 regression (scripts/step_overhead.py: flex and torch, the
#         free-memory reading and the stage peaks switched off in turn, the memory queries' host
#         cost, readings per step, dynamo's recompiles), then where a near-limit trunk step's time
#         goes (scripts/near_limit_profile.py: one boltz2 block at N=8,192 without a cap and under
#         caps that leave a near-limit point's few GiB free; per-op seconds, chunk sizes, kernels).
set -u
CALLS=${1:?call name(s)}
OUT=${OUT:?set OUT}
BUDGET_S=${BUDGET_S:-580}
START=$(date +%s)
source scripts/campaign_lib.sh  # gpu_setup, left, point, script_phase, archive_out
gpu_setup

for CALL in $CALLS; do
  case "$CALL" in
    d) script_phase step_overhead_512 python3 scripts/step_overhead.py --n 512 --kernels flex torch \
         --out "$OUT/step_overhead_512.json"
       script_phase near_limit_8192 python3 scripts/near_limit_profile.py --n 8192 --caps-gib 0 38 36 35 \
         --out "$OUT/near_limit_8192.json"
       grep -v '^ *chunk\|^{' "$OUT/near_limit_8192.log" | tail -45 ;;
    *) echo "unknown call $CALL"; exit 2 ;;
  esac
done
nvidia-smi > "$OUT/nvidia-smi_after.txt" 2>&1
archive_out
