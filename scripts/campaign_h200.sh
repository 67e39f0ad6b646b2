#!/usr/bin/env bash
# The first H200 campaign of the reference trunk (boltz2 preset, bf16, trunk only, no
# recycling), sized to one 10-minute device call on a two-GPU H200 machine:
#   phase 1: two single-GPU multiruns side by side, one per GPU (cp=1 max-N probe | cp=1 walltime)
#   phase 2: cp=2 (1d) over both GPUs: walltime, then the max-N probe
# then the tool's own report over everything. Each phase has a hard time limit so the call
# always returns; what a killed phase measured stays in its probe_state.json.
#   bash scripts/campaign_h200.sh OUTDIR
set -u
OUTDIR=${1:-outputs/campaign}
mkdir -p "$OUTDIR"
COMMON=(model=boltz2 dtype=bf16 workflow=inference workflow.recycles=0 workflow.sampling=false topology=1d)
PROBE=(routine=probe probe.depth=1 probe.growth=2)
nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1

CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m cpbench -m "${COMMON[@]}" "${PROBE[@]}" cp=1 \
  probe.start=1024 probe.granularity=4096 probe.timeout_s=120 \
  hydra.sweep.dir="$OUTDIR/probe_inference_cp1" report.out="$OUTDIR/probe_inference_cp1/report.md" \
  > "$OUTDIR/probe_inference_cp1.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m cpbench -m "${COMMON[@]}" routine=timing cp=1 N=512,2048 \
  hydra.sweep.dir="$OUTDIR/timing_inference_cp1" report.out="$OUTDIR/timing_inference_cp1/report.md" \
  > "$OUTDIR/timing_inference_cp1.log" 2>&1 &
wait

timeout 110 python3 -m cpbench -m "${COMMON[@]}" routine=timing cp=2 N=512,2048 \
  hydra.sweep.dir="$OUTDIR/timing_inference_cp2" report.out="$OUTDIR/timing_inference_cp2/report.md" \
  > "$OUTDIR/timing_inference_cp2.log" 2>&1
timeout 190 python3 -m cpbench -m "${COMMON[@]}" "${PROBE[@]}" cp=2 \
  probe.start=2048 probe.granularity=8192 probe.timeout_s=110 \
  hydra.sweep.dir="$OUTDIR/probe_inference_cp2" report.out="$OUTDIR/probe_inference_cp2/report.md" \
  > "$OUTDIR/probe_inference_cp2.log" 2>&1

python3 -m cpbench.report "$OUTDIR" > "$OUTDIR/report.log" 2>&1
grep -h -E "probe N=|timing|max_n" "$OUTDIR"/*.log | cut -c1-220
