#!/usr/bin/env bash
# The second H200 campaign (two-GPU machine), in device calls of at most 10 minutes each:
#   bash scripts/campaign2_h200.sh OUTDIR call1|call2|call3|call4|call5 [SECONDS]
# call1, two single-GPU lanes side by side:
#   GPU0: training max-N probe cp=1 (all 64 blocks, checkpointing) -> walltime sweep cp=1 ->
#         inference with sampling N=1024 cp=1
#   GPU1: inference with sampling N=2048 cp=1 (boltz2: 3 recycles, 200 steps x 5 samples)
# call2: GPU0 the cp=1 training probe again (memory.cuda_alloc_conf=expandable_segments:True, the
#   new default) | GPU1 sampling N=1024 cp=1 with a timing timeout (a cut point says how far it
#   got); then the cp=2 (1d) training max-N probe over both GPUs
# call3, cp=2: walltime sweep 1d -> 1d vs 2d (1x2) at N=4096, 8192 -> the cp=2 training probe
#   from 2560 (call2's from 3584 finished no step in 300 s)
# Results of calls 1-3: docs/benchmarks/2026-11-30-h200-b/ and docs/perf_notes.md. The next
# session (call4 to call6) runs with the backward-aware training chunk budget:
# call4, two single-GPU lanes: the cp=1 training target (one point, N=2560) | sampling N=1024
#   cp=1 (8 steps); then whichever lane is free first runs the max-N probe with sampling at cp=1
# call5: 2d 1x2 at N=8192; the cp=2 training target (one point, N=3584)
# call6: sampling N=1024 cp=2; the max-N probes with sampling, 1d and 2d (1x2)
# call7: call6's probes continued from their probe_state.json (SEED=call6's OUTDIR)
# Fourth session (calls 8 to 10, in the order run: call9, call8, call10):
# call9: the 2d (1x2) max-N probe with sampling without a probe budget and 240 s per point
#   (call7's 16384 timed out at 100 s); then 2d 1x2 at N=8192 with the cuDNN attention path
#   (sdpa_lse.py; result stats.attention_lse_kernel says which kernel ran)
# call8: sampling N=2048 cp=2 (about 65 s per step by the N=1024 stage times: the whole call)
# call10, two single-GPU lanes: GPU0 the cp=1 max-N probe with sampling from 3072 with 300 s per
#   point (call4's 16384 timed out at 150 s) | GPU1 sampling N=2048 cp=1: 8 steps do not fit a
#   call; the timing timeout keeps the steps it finished (result "partial")
# call11: the device time left: the 2d trunk-only max-N probe; the 2d slice at 4096 with cuDNN
# call12 (prepared, not run): the cp=2 1d max N with sampling, bisected between 16384 and 24576
# Every phase gets min(its limit, what is left of SECONDS); a phase cut short keeps what it
# measured (result.json per finished point, probe_state.json per probe point).
# The walltime sweeps run a one-block slice of the boltz2 trunk (model.blocks=1,
# model.msa_blocks=0): a 64-block pass at N=8192 takes ~13 min on one H200, eight of them do
# not fit a device call; the per-block time is what the N-scaling and cp ratio read.
# CPU dry run of the command lines: DRY=1 bash scripts/campaign2_h200.sh /tmp/dry call1
set -u
OUTDIR=${1:?OUTDIR}
CALL=${2:?call1|call2|call3|call4|call5}
BUDGET_S=${3:-570}
DEADLINE=$(( $(date +%s) + BUDGET_S ))
mkdir -p "$OUTDIR"

if [ "${DRY:-0}" = 1 ]; then  # same phases, CPU-sized
  MODEL=(model=tiny dtype=fp32) ; SCALE=16 ; unset CUDA_VISIBLE_DEVICES
else
  MODEL=(model=boltz2 dtype=bf16) ; SCALE=1
  nvidia-smi > "$OUTDIR/nvidia-smi_$CALL.txt" 2>&1
fi
n() { local out=() v; for v in $(echo "$1" | tr , ' '); do out+=($(( v / SCALE ))); done; (IFS=,; echo "${out[*]}"); }

# phase NAME LIMIT_S overrides... : one multirun into OUTDIR/NAME, log beside it
phase() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) - 10 ))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then echo "skip $name: ${left}s left" | tee -a "$OUTDIR/skipped.txt"; return; fi
  echo "$(date +%T) start $name (limit ${limit}s)"
  timeout "$limit" python3 -m cpbench -m "${MODEL[@]}" "$@" \
    hydra.sweep.dir="$OUTDIR/$name" report.out="$OUTDIR/$name/report.md" > "$OUTDIR/$name.log" 2>&1
  local rc=$?
  echo "$(date +%T) end $name rc=$rc"
}

TRUNK=(workflow=inference workflow.recycles=0 workflow.sampling=false)
SLICE=(model.blocks=1 model.msa_blocks=0)
SAMPLING=(workflow=inference routine=timing)  # boltz2 defaults: 3 recycles, 200 steps x 5 samples
# max N with sampling: the peak of a sampler step does not grow with steps, nor with recycles
# (no autograd): 2 steps, no recycling, probe depth 1 (verified at the first point)
SAMPLING_PROBE=(workflow=inference workflow.sampling_steps=2 workflow.recycles=0 routine=probe
                probe.depth=1 probe.growth=2 probe.start=$(n 2048))
TRAIN_PROBE=(workflow=training routine=probe probe.timeout_s=300)
# call6's max-N probes with sampling at cp=2; call7 continues them, which needs the same overrides
CP2_SAMPLING_PROBE_1D=("${SAMPLING_PROBE[@]}" probe.granularity=$(n 8192) cp=2 topology=1d probe.timeout_s=100
                       probe.budget_s=60)
CP2_SAMPLING_PROBE_2D=("${SAMPLING_PROBE[@]}" probe.granularity=$(n 8192) cp=2 topology=2d topology.cp0=1
                       probe.timeout_s=100 probe.budget_s=60)

# queue "NAME|LIMIT_S|overrides" ...: run each job no other lane has claimed (mkdir is atomic)
queue() {
  local job name limit
  for job in "$@"; do
    IFS='|' read -r name limit rest <<< "$job"
    mkdir "$OUTDIR/.claim_$name" 2>/dev/null || continue
    # shellcheck disable=SC2086
    phase "$name" "$limit" $rest
  done
}
QUEUE4=("probe_sampling_cp1|300|${SAMPLING_PROBE[*]} cp=1 probe.timeout_s=150 probe.budget_s=120 probe.granularity=$(n 4096)")

case $CALL in
call1)
  ( export CUDA_VISIBLE_DEVICES=0
    phase probe_training_cp1 280 "${TRAIN_PROBE[@]}" cp=1 probe.start=$(n 2560) probe.growth=1.2 \
      probe.granularity=$(n 512)
    phase walltime_cp1 200 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=1 N=$(n 512,1024,2048,4096,8192)
    phase sampling_cp1_n1024 150 "${SAMPLING[@]}" cp=1 N=$(n 1024)
  ) > "$OUTDIR/lane0.txt" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    phase sampling_cp1_n2048 600 "${SAMPLING[@]}" cp=1 N=$(n 2048)
  ) > "$OUTDIR/lane1.txt" 2>&1 &
  wait ;;
call2)  # after call1: 2560 oom at cp=1 without expandable segments; the sampling points hit the shell's limit
  ( export CUDA_VISIBLE_DEVICES=0
    phase probe_training_cp1_expandable 225 "${TRAIN_PROBE[@]}" cp=1 probe.start=$(n 2560) probe.growth=1.1 \
      probe.granularity=$(n 256) probe.timeout_s=200
  ) > "$OUTDIR/lane0.txt" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    phase sampling_cp1_n1024 225 "${SAMPLING[@]}" cp=1 N=$(n 1024) timing.timeout_s=200
  ) > "$OUTDIR/lane1.txt" 2>&1 &
  wait
  phase probe_training_cp2 330 "${TRAIN_PROBE[@]}" cp=2 topology=1d probe.start=$(n 3584) \
    probe.growth=1.1428 probe.granularity=$(n 512) ;;
call3)  # after call2: the device time left covers the walltime sweeps and one training probe
  phase walltime_cp2_1d 100 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=2 topology=1d N=$(n 512,1024,2048,4096,8192)
  phase walltime_cp2_2d 70 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=2 topology=2d topology.cp0=1 N=$(n 4096,8192)
  phase probe_training_cp2 400 "${TRAIN_PROBE[@]}" cp=2 topology=1d probe.start=$(n 2560) \
    probe.growth=1.2 probe.granularity=$(n 512) probe.timeout_s=220 ;;
call4)  # third session: two single-GPU lanes; each lane runs its own job, then takes the next
  # unclaimed job of the shared queue (QUEUE4)
  ( export CUDA_VISIBLE_DEVICES=0
    phase probe_training_cp1_n2560 450 "${TRAIN_PROBE[@]}" cp=1 probe.start=$(n 2560) probe.budget_s=1 \
      probe.timeout_s=430
    queue "${QUEUE4[@]}"
  ) > "$OUTDIR/lane0.txt" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    phase sampling_cp1_n1024 420 "${SAMPLING[@]}" cp=1 N=$(n 1024) timing.timeout_s=400
    queue "${QUEUE4[@]}"
  ) > "$OUTDIR/lane1.txt" 2>&1 &
  wait ;;
call5)  # 2d 1x2 at N=8192 (call3's 70 s phase was too short), then the cp=2 training target, one point
  phase walltime_cp2_2d_n8192 130 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=2 topology=2d topology.cp0=1 \
    N=$(n 8192) timing.timeout_s=120
  phase probe_training_cp2_n3584 440 "${TRAIN_PROBE[@]}" cp=2 topology=1d probe.start=$(n 3584) probe.budget_s=1 \
    probe.timeout_s=420 ;;
call6)  # sampling at cp=2: the timing at N=1024, then the max-N probes with sampling, 1d and 2d (1x2)
  phase sampling_cp2_n1024 280 "${SAMPLING[@]}" cp=2 topology=1d N=$(n 1024) timing.timeout_s=260
  phase probe_sampling_cp2_1d 140 "${CP2_SAMPLING_PROBE_1D[@]}"
  phase probe_sampling_cp2_2d 140 "${CP2_SAMPLING_PROBE_2D[@]}" ;;
call7)  # the device time left after call6: its two sampling probes continue from their probe_state.json
  # (SEED=call6's OUTDIR; same overrides, so the same signature: no new depth check, known points kept)
  for p in probe_sampling_cp2_2d probe_sampling_cp2_1d; do
    mkdir -p "$OUTDIR/$p/0" && cp "${SEED:?call6 OUTDIR}/$p/0/probe_state.json" "$OUTDIR/$p/0/"
  done
  phase probe_sampling_cp2_2d 190 "${CP2_SAMPLING_PROBE_2D[@]}"
  phase probe_sampling_cp2_1d 170 "${CP2_SAMPLING_PROBE_1D[@]}" ;;
call8)  # sampling at N=2048, cp=2
  phase sampling_cp2_n2048 590 "${SAMPLING[@]}" cp=2 topology=1d N=$(n 2048) timing.timeout_s=560 ;;
call9)  # the 2d max-N probe with sampling (no probe.budget_s: call6's budget of 60 s would stop it before
  # 16384), then the 2d slice at N=8192 with the cuDNN path (call5 timed it with the memory-efficient kernel)
  phase probe_sampling_cp2_2d_long 330 "${SAMPLING_PROBE[@]}" probe.granularity=$(n 8192) cp=2 topology=2d \
    topology.cp0=1 probe.timeout_s=240
  phase walltime_cp2_2d_cudnn 130 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=2 topology=2d topology.cp0=1 \
    N=$(n 8192) timing.timeout_s=120 ;;
call10)  # two single-GPU lanes for the whole call
  ( export CUDA_VISIBLE_DEVICES=0
    # from 3072 (the depth check runs all 64 blocks there, about a minute): 6144, 12288, ...
    phase probe_sampling_cp1_long 575 "${SAMPLING_PROBE[@]}" probe.granularity=$(n 4096) cp=1 \
      probe.start=$(n 3072) probe.timeout_s=300
  ) > "$OUTDIR/lane0.txt" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    phase sampling_cp1_n2048 575 "${SAMPLING[@]}" cp=1 N=$(n 2048) timing.timeout_s=555
  ) > "$OUTDIR/lane1.txt" 2>&1 &
  wait ;;
call11)  # the device time left: the 2d trunk-only max-N probe (1d's is call1 of the first campaign),
  # then the 2d slice at N=4096 with cuDNN
  phase probe_trunk_cp2_2d 300 "${TRUNK[@]}" routine=probe probe.depth=1 probe.growth=2 probe.start=$(n 2048) \
    probe.granularity=$(n 8192) cp=2 topology=2d topology.cp0=1 probe.timeout_s=200
  phase walltime_cp2_2d_cudnn_n4096 80 "${TRUNK[@]}" "${SLICE[@]}" routine=timing cp=2 topology=2d topology.cp0=1 \
    N=$(n 4096) timing.timeout_s=70 ;;
call12)  # prepared, not run: bisect the cp=2 max N with sampling between 16384 (fits) and 24576 (oom);
  # probe.depth_check_n keeps the all-block check at 2048 instead of at the large start
  # (16384 again, then 20480 and the bisection: the search's bounds are points it measured itself)
  phase probe_sampling_cp2_1d_bisect 560 "${SAMPLING_PROBE[@]}" cp=2 topology=1d probe.start=$(n 16384) \
    probe.growth=1.25 probe.depth_check_n=$(n 2048) probe.granularity=$(n 2048) probe.timeout_s=240 ;;
*) echo "unknown call $CALL"; exit 2 ;;
esac
cat "$OUTDIR"/lane*.txt 2>/dev/null
grep -h -E "probe N=|probe depth|median|error|Error" "$OUTDIR"/*.log 2>/dev/null | cut -c1-240 | tail -60
