#!/usr/bin/env bash
# The next device session's calls on one H200 (docs/perf_notes.md, "Eighth device session").
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> BUDGET_S=<s> bash scripts/campaign7_h200.sh CALL...
# CALL n: the scratch channel chunks of the lean triangle multiplication, against call d/e's
#         figures of the code before them: one block at N=16,384 in one step with compilation
#         (call e: 67.6 s) and N=8,192 under the same caps as call d (35 GiB: 7.17 s).
# CALL g: #22, the default job as the README gives it (`python -m cpbench`), for as long as the
#         call lasts; its log says how far it got.
# #17's training step at N=1,536 (flex with model.compile_training=true, then torch) is
# campaign4_h200.sh's call g.
set -u
CALLS=${1:?call name(s)}
source scripts/campaign_lib.sh  # campaign_begin, left, point, probe, script_phase, archive_out, campaign_end
campaign_begin 580

for CALL in $CALLS; do
  case "$CALL" in
    n) PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True script_phase near_limit_16384 python3 \
         scripts/near_limit_profile.py --single --n 16384 --out "$OUT/near_limit_16384.json"
       script_phase near_limit_8192 python3 scripts/near_limit_profile.py --n 8192 --caps-gib 0 36 35 \
         --out "$OUT/near_limit_8192.json" ;;
    g) point default_job 120 ;;
    *) echo "unknown call $CALL"; exit 2 ;;
  esac
done
campaign_end
