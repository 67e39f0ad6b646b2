#!/usr/bin/env bash
# Exact max N and the fast trunk after the deterministic chunk budget (#17, #18), on one H200.
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> bash scripts/campaign4_h200.sh CALL
# CALL e: #18's cp=1 trunk-only max-N probe as a user runs it (boltz2 preset, recycles 0, kernels
#         auto), from N=1024 to granularity 512, predict + verify, inside this one call; then, with
#         PROFILE=1 and while time lasts, where one block's time goes (scripts/block_profile.py,
#         flex and torch, N=2048).
# CALL f: #17 side by side: the 64-block trunk pass at N=2048 and N=512, flex then torch; then the
#         max-N check at N=16,000 with kernels=torch (one probe point after a cheap depth check).
# CALL g: #17 side by side: one training step (64 blocks, checkpointing, AdamW) at N=1536, cp=1,
#         kernels=flex with the compiled training path, then kernels=torch.
set -u
CALL=${1:?call name}
source scripts/campaign_lib.sh  # campaign_begin, left, point, script_phase, archive_out, campaign_end
campaign_begin 575
TRUNK="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing cp=1"
TRAIN="model=boltz2 workflow=training routine=timing cp=1"

case "$CALL" in
  e)
    point probe_trunk_cp1 300 model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
      probe.start=1024 probe.granularity=512 probe.strategy=predict probe.verify=true probe.timeout_s=200 probe.depth=1 \
      probe.budget_s=$(( $(left) - 110 ))
    grep -h "probe N=\|predicted\|verify\|depth check" "$OUT/probe_trunk_cp1.log" | cut -c1-400
    if [ "${PROFILE:-0}" = 1 ]; then
      script_phase block_profile_2048 python3 scripts/block_profile.py --n 2048 --kernels flex torch \
        --out "$OUT/block_profile_2048.json"
    fi
    ;;
  h)  # call e3's prediction (17,005) as a one-granularity bracket, measured directly at depth 1:
      # 16,512 must fit and 17,024 (the ramp's next point, growth 1.031) fail; no verification
    point probe_trunk_cp1_bracket 200 model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
      probe.strategy=bisect probe.start=16512 probe.growth=1.031 probe.granularity=512 probe.depth=1 \
      probe.depth_check_n=512 probe.verify=false probe.timeout_s=250 probe.max_points=4
    grep -h "probe N=\|depth check" "$OUT/probe_trunk_cp1_bracket.log" | cut -c1-400
    ;;
  f)
    point trunk2048_flex 150 $TRUNK N=2048 model.kernels=flex timing.timeout_s=200
    point trunk2048_torch 130 $TRUNK N=2048 model.kernels=torch timing.timeout_s=150
    point trunk512_flex 60 $TRUNK N=512 model.kernels=flex timing.timeout_s=90
    point trunk512_torch 45 $TRUNK N=512 model.kernels=torch timing.timeout_s=60
    point fit16000_torch 150 model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
      model.kernels=torch probe.start=16000 probe.depth=1 probe.depth_check_n=1024 probe.max_points=2 \
      probe.verify=false probe.timeout_s=$(( $(left) - 30 ))
    grep -h "probe N=\|depth check" "$OUT/fit16000_torch.log" | cut -c1-400
    ;;
  g)
    point train1536_flex 200 $TRAIN N=1536 model.kernels=flex model.compile_training=true timing.timeout_s=300
    point train1536_torch 200 $TRAIN N=1536 model.kernels=torch timing.timeout_s=$(( $(left) - 15 ))
    ;;
  *) echo "unknown call $CALL"; exit 2 ;;
esac
campaign_end
