#!/usr/bin/env bash
# The ninth to twelfth device sessions' calls on one H200 (docs/perf_notes.md, "Ninth device
# session" onwards).
#   run on the GPU machine from a tree that has .whl/ (and .whl/stock/ for CALL s):
#   OUT=<dir> BUDGET_S=<s> bash scripts/campaign8_h200.sh CALL...
# CALL s:     #20, the stock Boltz-2 baseline (scripts/campaign_stock_h200.sh) in $OUT/stock, for
#             STOCK_S seconds (default 300) of the budget.
# CALL diag:  #22, where the default job's near-limit probe step goes (its model: MSA module,
#             trunk, sampler; depth DIAG_DEPTH, default 1) at N=DIAG_N (default 16,384), one step
#             with compilation, op clock, chunk log and kernel table (scripts/near_limit_profile.py).
# CALL trainflex, traintorch: #17, one training step (64 blocks, checkpointing, AdamW) at
#             N=1,536, cp=1, 3 warmup + 5 repeats (the enforced minimums): kernels=flex with the
#             compiled training path, and kernels=torch, each for what is left of its call. The
#             pair (about 670 s) does not fit one call: run them as two calls back to back on the
#             warm machine for the ratio.
# CALL fit:   #17, max N not worse with kernels=torch: one trunk-only probe point at N=16,000 (the
#             depth check at N=1,024 is the probe's first point: probe.budget_s=20 lets the second
#             start; with budget_s=1 the fifteenth session's first try stopped after the check).
# CALL tfit:  #17/#19, the compiled training path (model.compile_training=true): one lean probe
#             point at N=2,048 (what the training probe's ramp runs; 335 s before the triangle
#             attention's chunk estimate for flex), then one full (non-lean) probe point at
#             N=2,560, the cp=1 max N of the eager path (max N not worse).
# CALL tleant: the same lean training points at N=1,024 and 2,048 on the eager training path
#             (model.compile_training=false; the default until the thirteenth session), for what
#             is left of the call.
# CALL samp:  #17, inference with sampling (boltz2 defaults) at N=2,048, cp=1, the full timing
#             contract (3 warmup + 5 repeats), kernels=auto, for what is left of the call.
# CALL h19:   #19, the headline command as typed on one GPU, `-m workflow=training cp=1,2,4,8
#             N=1024,2048`, plus only its output location and resume=true, for what is left of the
#             call. It needs more than one call (its probe and the N=2,048 timing are several
#             minutes each), so the sweep runs in one fixed folder, H19_DIR (default
#             /tmp/cpbench_h19), that outlives a call while the machine stays warm; a freshly
#             started machine first copies RESUME=<the previous call's h19 folder, carried in the
#             tree> there. Finished points are skipped (resume=true), the probe continues from its
#             probe_state.json, and its lock (older than the new run) is taken over. The folder is
#             copied to $OUT/h19 at the end of the call. Resume from the commit that made the
#             folder (a point's and a probe's signatures hash cpbench's sources: another commit
#             starts afresh); the thirteenth session's folder, docs/benchmarks/2026-12-02-h200-g/
#             call-h2/h19, was made by a9aacd9.
# CALL tprof: where a training step's time goes (scripts/training_profile.py): the boltz2 trunk
#             with 2 blocks, cp=1, one step per variant in its own process: eager at N=1,024 and
#             2,048, eager lean at 2,048, block-only checkpointing at 2,048, compiled (flex,
#             compile_training) at 2,048 and compiled lean at 2,048; each capped at TPROF_S
#             (default 120) seconds.
# CALL agree: #17 item 3, the chunk sizes agreed once per inference block (block.agreed_chunks)
#             against the per-op agreement before it, side by side: the 64-block pass at N=512
#             (boltz2, trunk only, kernels=auto), before (BASE_SRC: a snapshot of a commit without
#             it, e.g. 4a30e3d, with its commit.txt) then after, at cp=1 and, where two GPUs are
#             visible, cp=2.
# CALL host512: #17, where the N=512 64-block pass's host time goes (scripts/step_overhead.py
#             --host-profile): flex and torch, as is, then 5 steps each under torch.profiler
#             (wall vs the GPU's summed kernel time, launches, compiled-region calls, top host ops).
# CALL graphs: #17, the trunk's blocks replayed as a CUDA graph (model.cuda_graphs=true): first
#             scripts/graph_parity.py (4 blocks at N=256 and 512, flex and torch, bf16 and fp32:
#             the replayed blocks, and the sampler's replayed denoiser, against eager), then the 64-block pass (boltz2, trunk only, cp=1) at N=512
#             and 2,048, kernels=auto with graphs, without, and kernels=torch, side by side.
# CALL gparity: scripts/graph_parity.py alone (as the first part of CALL graphs).
# CALL graphsamp: #17, the same with sampling (boltz2 defaults: 3 recycles, 200 steps x 5
#             samples; the denoiser's calls replay from the second of each sampling run), cp=1,
#             kernels=auto with graphs and without, at N=512 then 1,024.
# CALL bprof: #17, where one flex block's time goes at N=2,048 (scripts/block_profile.py with each
#             op's longest kernels), as is, then under inductor's coordinate-descent tuning and
#             under max-autotune (each a fresh process; BPROF_VARIANTS picks which).
# CALL fastpass: #17, the 64-block pass at N=2,048 (boltz2, trunk only, cp=1) after the in-place
#             fused passes: the block profile (bprof plain), then kernels=auto, the same under
#             inductor's coordinate-descent tuning, and kernels=torch, side by side.
# CALL verify: after the in-place fused passes: scripts/kernel_parity.py (flex vs torch, N=256),
#             scripts/graph_parity.py, the 64-block pass at N=512 with kernels=auto (graphs) and
#             kernels=torch side by side, then one non-lean trunk-only probe point at N=16,000 with
#             kernels=auto (max N not worse; bisect strategy, after the depth check at N=1,024).
# CALL fitauto: that probe point alone.
set -u
CALLS=${1:?call name(s)}
graph_parity() { script_phase graph_parity python3 scripts/graph_parity.py --n 256 512 --blocks 4 --out "$OUT/graph_parity.json"; }
# bprof VARIANT...: scripts/block_profile.py at N=2,048, flex, with each op's longest kernels, in a
# fresh process per variant: plain, cdt (coordinate-descent tuning), autotune (max-autotune).
bprof() {
  local v envs
  for v in "$@"; do
    case $v in
      plain) envs="" ;;
      cdt) envs="TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1" ;;
      autotune) envs="TORCHINDUCTOR_MAX_AUTOTUNE=1" ;;
    esac
    script_phase "bprof_$v" env $envs python3 scripts/block_profile.py --n 2048 --kernels flex \
      --kernel-rows 12 --out "$OUT/bprof_$v.json" | cut -c1-300
  done
}
# fitauto: one non-lean trunk-only probe point at N=16,000, kernels=auto, after the depth check at
# N=1,024 (probe.budget_s=120: with 20 the check's 13 s point plus its process start used it up in
# this session's call v, and the probe stopped after the check).
fitauto() {
  probe fit16000_auto model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
    probe.strategy=bisect probe.start=16000 probe.depth=1 probe.depth_check_n=1024 probe.max_points=2 \
    probe.budget_s=120 probe.verify=false probe.timeout_s=$(( $(left) - 30 ))
}
source scripts/campaign_lib.sh  # campaign_begin, left, point, probe, script_phase, archive_out, campaign_end
campaign_begin 570
TRAIN="model=boltz2 workflow=training routine=timing cp=1"
PASS="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing cp=1"  # 64-block pass
# one probe point at probe.start (max_points >= 2 is enforced; budget_s=1 starts no second point)
TPROBE="model=boltz2 workflow=training routine=probe cp=1 probe.max_points=2 probe.budget_s=1 probe.verify=false"

for CALL in $CALLS; do
  case "$CALL" in
    s) OUT="$OUT/stock" BUDGET_S=${STOCK_S:-300} bash scripts/campaign_stock_h200.sh 2>&1 | grep -v "^ " | cut -c1-400
       rm -f "$OUT/stock/all.tgz" ;;  # this call's archive holds it
    diag) PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True script_phase near_limit_sampling python3 \
            scripts/near_limit_profile.py --single --workflow sampling --depth "${DIAG_DEPTH:-1}" \
            --n "${DIAG_N:-16384}" --out "$OUT/near_limit_sampling.json" ;;
    trainflex) point train1536_flex 170 $TRAIN N=1536 model.kernels=flex model.compile_training=true timing.timeout_s=$(( $(left) - 15 )) ;;
    traintorch) point train1536_torch 170 $TRAIN N=1536 model.kernels=torch timing.timeout_s=$(( $(left) - 15 )) ;;
    fit) probe fit16000_torch model=boltz2 workflow.sampling=false workflow.recycles=0 routine=probe cp=1 \
           model.kernels=torch probe.start=16000 probe.depth=1 probe.depth_check_n=1024 probe.max_points=2 probe.budget_s=20 \
           probe.verify=false probe.timeout_s=$(( $(left) - 30 )) ;;
    tfit) probe tlean2048_compiled $TPROBE probe.start=2048 model.compile_training=true probe.timeout_s=300
          probe tfit2560_compiled $TPROBE probe.start=2560 probe.strategy=bisect model.compile_training=true \
            probe.timeout_s=$(( $(left) - 20 )) ;;
    tleant) probe tlean1024_torchpath $TPROBE probe.start=1024 model.compile_training=false probe.timeout_s=120
            probe tlean2048_torchpath $TPROBE probe.start=2048 model.compile_training=false probe.timeout_s=$(( $(left) - 20 )) ;;
    samp) point sampling2048_auto 400 model=boltz2 routine=timing cp=1 N=2048 timing.timeout_s=$(( $(left) - 15 )) ;;
    h19) H19_DIR=${H19_DIR:-/tmp/cpbench_h19}
         if [ ! -d "$H19_DIR" ] && [ -n "${RESUME:-}" ]; then cp -r "$RESUME" "$H19_DIR"; fi
         echo "h19 in $H19_DIR: $(find "$H19_DIR" -name result.json 2>/dev/null | wc -l) result.json before this call"
         t0=$(date +%s)
         timeout $(( $(left) - 20 )) python3 -m cpbench -m workflow=training cp=1,2,4,8 N=1024,2048 \
           hydra.sweep.dir="$H19_DIR" report.out="$H19_DIR/cp_benchmark.md" resume=true >> "$H19_DIR.log" 2>&1
         echo "phase h19 rc=$? $(( $(date +%s) - t0 )) s"
         cp -r "$H19_DIR" "$OUT/h19"; cp "$H19_DIR.log" "$OUT/h19.log"
         grep -h "probe N=\|predicted\|verify\|timed one\|insufficient\|probed the largest\|interrupted" "$OUT/h19.log" | cut -c1-300 ;;
    tprof) for v in "eager 1024" "eager 2048" "eager 2048 --lean" "eager_block 2048" "compiled 2048" \
                    "compiled 2048 --lean"; do
             set -- $v
             name="tprof_$1_$2${3:+_lean}"
             if [ "$(left)" -le 40 ]; then echo "skip $name: $(left) s left"; continue; fi
             t0=$(date +%s)
             timeout $(( $(left) - 5 < ${TPROF_S:-120} ? $(left) - 5 : ${TPROF_S:-120} )) \
               python3 scripts/training_profile.py --variant "$1" --n "$2" ${3:-} --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
             echo "phase $name rc=$? $(( $(date +%s) - t0 )) s"
             python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [r.pop(k) for k in ('top_kernels',)]; print(json.dumps(r))" \
               "$OUT/$name.json" 2>/dev/null
           done ;;
    host512) script_phase host512 python3 scripts/step_overhead.py --n 512 --kernels flex torch --variants as_is \
               --host-profile --out "$OUT/host512.json" ;;
    agree)
      PASS512="model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing N=512"
      for cp in 1 $([ "$(nvidia-smi -L | wc -l)" -ge 2 ] && echo 2); do
        (cd "${BASE_SRC:?set BASE_SRC}" && CPBENCH_GIT_COMMIT=$(cat commit.txt) \
           point "pass512_cp${cp}_before" 120 $PASS512 cp=$cp timing.timeout_s=150)
        point "pass512_cp${cp}_after" 120 $PASS512 cp=$cp timing.timeout_s=150
      done ;;
    gparity) graph_parity ;;
    graphs)
      graph_parity
      for n in 512 2048; do
        point "pass${n}_graphs" 90 $PASS N=$n model.cuda_graphs=true timing.timeout_s=150
        point "pass${n}_flex" 90 $PASS N=$n timing.timeout_s=150
        point "pass${n}_torch" 90 $PASS N=$n model.kernels=torch timing.timeout_s=$(( $(left) - 15 < 170 ? $(left) - 15 : 170 ))
      done ;;
    graphsamp)
      for n in 512 1024; do
        point "samp${n}_graphs" 100 model=boltz2 routine=timing cp=1 N=$n model.cuda_graphs=true timing.timeout_s=200
        point "samp${n}_flex" 100 model=boltz2 routine=timing cp=1 N=$n timing.timeout_s=200
      done ;;
    bprof) bprof ${BPROF_VARIANTS:-plain cdt autotune} ;;
    fastpass)
      bprof plain
      point pass2048_flex 90 $PASS N=2048 timing.timeout_s=150
      TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 point pass2048_flex_cdt 90 $PASS N=2048 timing.timeout_s=150
      point pass2048_torch 90 $PASS N=2048 model.kernels=torch timing.timeout_s=$(( $(left) - 15 < 170 ? $(left) - 15 : 170 )) ;;
    verify)
      script_phase kernel_parity timeout 200 python3 scripts/kernel_parity.py --n 256 --out "$OUT/kernel_parity.json"
      graph_parity
      point pass512_auto 60 $PASS N=512 timing.timeout_s=100
      point pass512_torch 60 $PASS N=512 model.kernels=torch timing.timeout_s=100
      fitauto ;;
    fitauto) fitauto ;;
    *) echo "unknown call $CALL"; exit 2 ;;
  esac
done
campaign_end
