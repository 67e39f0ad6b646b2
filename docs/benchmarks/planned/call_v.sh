#!/usr/bin/env bash
# Call V (docs/benchmarks/planned/README.md): what bounds the Triton passes (ops/triton_passes.py) and
# their backward at N=2,048 (one boltz2 block's shapes, bf16), the transition first: 6.4 ms on an H200
# against a 2.1 ms floor. Each kernel is timed at its setting in the code (do_bench, no profiler),
# then Nsight Compute replays two launches of each and records issue slots, pipes, stall reasons,
# occupancy, and the bytes it moves in DRAM and through L2 (a kernel that loads its weights again for
# every tile of rows moves them through L2 once per tile). Runs on an H100 or an H200.
#   OUT=DIR bash docs/benchmarks/planned/call_v.sh      (V_BWD=0: the forward kernels only)
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}/callV
source docs/benchmarks/planned/script_env.sh
cat "$OUT/env.txt"
FWD="norm_linear triangle_operands triangle_update gated_output swiglu_transition"
BWD=""
[ "${V_BWD:-1}" = 1 ] && BWD="norm_linear_bwd triangle_operands_bwd triangle_update_bwd gated_output_bwd swiglu_transition_bwd"
t0=$SECONDS
timeout "${V_TIME_LIMIT_S:-150}" python3 scripts/tune_triton_passes.py --n 2048 --default-only --kernels $FWD $BWD \
  --out "$OUT/times.json" > "$OUT/times.log" 2>&1
echo "times rc=$? $((SECONDS - t0)) s"; grep '"best"' "$OUT/times.log"
source docs/benchmarks/planned/ncu_env.sh
t0=$SECONDS
timeout "${V_LIMIT_S:-300}" "$NCU" --target-processes all \
  -k "regex:_(norm_linear|triangle_operands|triangle_update|gated_output|swiglu)_(kernel|bwd)" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
  --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
  --csv --page raw --print-units base \
  python3 scripts/tune_triton_passes.py --n 2048 --default-only --calls 2 --kernels $FWD $BWD \
  > "$OUT/ncu_raw.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$? $((SECONDS - t0)) s"; tail -c 1500 "$OUT/ncu.err"
python3 scripts/profile_ops.py limits "$OUT/ncu_raw.csv" --out "$OUT/limits.json"
gzip -f "$OUT/ncu_raw.csv"
