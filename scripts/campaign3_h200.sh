#!/usr/bin/env bash
# The fast-trunk campaign (kernels=flex vs kernels=torch, side by side in one run) on one H200.
#   run on the GPU machine from a tree that has .whl/ (../shared/gpu/README.md):
#   OUT=<dir> bash scripts/campaign3_h200.sh CALL
# CALL a: GPU kernel parity at N=256 (block and trunk, fp32 and bf16, forward and gradients),
#         then the 64-block trunk pass (boltz2, trunk only) at N=2048 and N=512, cp=1, flex then torch;
#         then one training step (64 blocks, checkpointing, AdamW) at N=1536, flex then torch,
#         while the call's time lasts (each point starts only with enough time left).
# CALL b: flex's pieces in isolation (attention static vs dynamic compile, fused passes) at N=2048, 512.
set -u
CALL=${1:?call name}
source scripts/campaign_lib.sh  # campaign_begin, left, point, script_phase, archive_out, campaign_end
campaign_begin 570
TRUNK="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing cp=1"
TRAIN="model=boltz2 workflow=training routine=timing cp=1"

case "$CALL" in
  a)
    t0=$(date +%s)
    timeout 120 python3 scripts/kernel_parity.py --n 256 --out "$OUT/kernel_parity.json" > "$OUT/kernel_parity.log" 2>&1
    echo "phase kernel_parity rc=$? $(( $(date +%s) - t0 )) s"; cat "$OUT/kernel_parity.log" | grep '^{' | cut -c1-300
    point trunk2048_flex 150 $TRUNK N=2048 model.kernels=flex timing.timeout_s=200
    point trunk2048_torch 130 $TRUNK N=2048 model.kernels=torch timing.timeout_s=150
    point trunk512_flex 60 $TRUNK N=512 model.kernels=flex timing.timeout_s=90
    point trunk512_torch 45 $TRUNK N=512 model.kernels=torch timing.timeout_s=60
    point train1536_flex 150 $TRAIN N=1536 model.kernels=flex timing.timeout_s=200
    point train1536_torch 150 $TRAIN N=1536 model.kernels=torch timing.timeout_s=200
    ;;
  b)  # where flex loses time: its pieces in isolation at N=2048 and N=512 (scripts/flex_microbench.py)
    for n in 2048 512; do
      t0=$(date +%s)
      timeout 240 python3 scripts/flex_microbench.py --n $n --rows 128 --out "$OUT/flex_microbench_$n.json" > "$OUT/flex_microbench_$n.log" 2>&1
      echo "phase flex_microbench_$n rc=$? $(( $(date +%s) - t0 )) s"; grep '^{' "$OUT/flex_microbench_$n.log"
    done
    ;;
  c)  # call a again after flex's static compile (dynamic shapes had cost it 8x): parity, trunk pass
    t0=$(date +%s)
    timeout 150 python3 scripts/kernel_parity.py --n 256 --out "$OUT/kernel_parity.json" > "$OUT/kernel_parity.log" 2>&1
    echo "phase kernel_parity rc=$? $(( $(date +%s) - t0 )) s"; grep '^{' "$OUT/kernel_parity.log" | cut -c1-400
    point trunk2048_flex 150 $TRUNK N=2048 model.kernels=flex timing.timeout_s=200
    point trunk2048_torch 130 $TRUNK N=2048 model.kernels=torch timing.timeout_s=150
    point trunk512_flex 60 $TRUNK N=512 model.kernels=flex timing.timeout_s=90
    point trunk512_torch 45 $TRUNK N=512 model.kernels=torch timing.timeout_s=60
    ;;
  d)  # #18: the cp=1 trunk-only max N, predicted bracket + verification, flex, granularity 512;
      # then the compiled training path's GPU parity (kernels.compile_training) while time lasts
    point probe_trunk_cp1_flex 300 model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
      model.kernels=flex probe.depth=1 probe.start=2048 probe.granularity=512 probe.strategy=predict \
      probe.verify=true probe.timeout_s=120 probe.budget_s=$(( $(left) - 150 ))
    grep -h "probe N=\|predict\|verify\|bracket" "$OUT/probe_trunk_cp1_flex.log" | cut -c1-300
    t0=$(date +%s)
    timeout $(( $(left) - 10 )) python3 scripts/kernel_parity.py --n 256 --out "$OUT/kernel_parity_training.json" > "$OUT/kernel_parity_training.log" 2>&1
    echo "phase kernel_parity_training rc=$? $(( $(date +%s) - t0 )) s"; grep '^{' "$OUT/kernel_parity_training.log" | cut -c1-500
    ;;
  *) echo "unknown call $CALL"; exit 2 ;;
esac
campaign_end
