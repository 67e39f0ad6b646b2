#!/usr/bin/env bash
# The eighth device session's calls on one H200 (docs/perf_notes.md, "Eighth device session").
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> BUDGET_S=<s> bash scripts/campaign6_h200.sh CALL...
# CALL d: diagnosis. #17's N=512 regression (scripts/step_overhead.py: flex and torch, the
#         free-memory reading and the stage peaks switched off in turn, the memory queries' host
#         cost, readings per step, dynamo's recompiles), then where a near-limit trunk step's time
#         goes (scripts/near_limit_profile.py: one boltz2 block at N=8,192 without a cap and under
#         caps that leave a near-limit point's few GiB free; per-op seconds, chunk sizes, kernels).
# CALL e: #17 side by side after the free-memory reading's fix: the 64-block trunk pass at N=512 and
#         N=2,048, kernels=flex then torch; then one step of one block at N=16,384 (near the real
#         limit, no cap) with its per-op seconds, chunk sizes and kernel table (near_limit_profile --single).
# CALL s: #18's cp=1 with-sampling max N (boltz2 defaults; probe depth 1), predict from N=1,024,
#         granularity 512, verified; it stops starting points after S_BUDGET_S (default 400) and
#         RESUME=<its folder> continues it in the next call (same cpbench/ sources).
set -u
CALLS=${1:?call name(s)}
source scripts/campaign_lib.sh  # campaign_begin, left, point, probe, script_phase, archive_out, campaign_end
campaign_begin 580

for CALL in $CALLS; do
  case "$CALL" in
    d) script_phase step_overhead_512 python3 scripts/step_overhead.py --n 512 --kernels flex torch \
         --out "$OUT/step_overhead_512.json"
       script_phase near_limit_8192 python3 scripts/near_limit_profile.py --n 8192 --caps-gib 0 38 36 35 \
         --out "$OUT/near_limit_8192.json"
       grep -v '^ *chunk\|^{' "$OUT/near_limit_8192.log" | tail -45 ;;
    e) TRUNK="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing cp=1"
       point trunk512_flex 60 $TRUNK N=512 model.kernels=flex timing.timeout_s=90
       point trunk512_torch 45 $TRUNK N=512 model.kernels=torch timing.timeout_s=60
       point trunk2048_flex 120 $TRUNK N=2048 model.kernels=flex timing.timeout_s=200
       point trunk2048_torch 130 $TRUNK N=2048 model.kernels=torch timing.timeout_s=150
       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True script_phase near_limit_16384 python3 \
         scripts/near_limit_profile.py --single --n 16384 --out "$OUT/near_limit_16384.json"
       grep -v '^ *chunk\|^{' "$OUT/near_limit_16384.log" | tail -40 ;;
    s) probe sampling_cp1 routine=probe cp=1 model=boltz2 probe.verify=true probe.strategy=predict \
         probe.start=1024 probe.depth=1 probe.granularity=512 probe.timeout_s=330 probe.budget_s=${S_BUDGET_S:-400} ;;
    *) echo "unknown call $CALL"; exit 2 ;;
  esac
done
campaign_end
