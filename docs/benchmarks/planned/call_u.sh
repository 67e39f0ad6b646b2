#!/usr/bin/env bash
# Call U (docs/benchmarks/planned/README.md): what bounds triangle attention's kernels at N=2,048
# (256 rows, bf16). Nsight Compute replays flex's compiled kernel and the Triton kernel (default
# TILES) once per launch and records, per kernel, the sections that say where the cycles go: issue
# slots and pipe utilization (the special-function unit's exponentials against the tensor cores),
# warp stall reasons, occupancy, and the speed of light. The raw page (every metric, base units) is
# kept as CSV; nothing is timed here (flex_microbench's own medians come from call T).
#   OUT=DIR bash docs/benchmarks/planned/call_u.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}/callU
source docs/benchmarks/planned/script_env.sh
cat "$OUT/env.txt"
source docs/benchmarks/planned/ncu_env.sh
t0=$SECONDS
# 5 launches per kernel (the parity call, 3 warmups, 1 repeat); each is replayed once per section pass
timeout "${U_LIMIT_S:-300}" "$NCU" --target-processes all -k "regex:triton_tem|_attention_kernel" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
  --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
  --csv --page raw --print-units base \
  python3 scripts/flex_microbench.py --n 2048 --cases triton --triton-default-only --repeats 1 \
  > "$OUT/ncu_raw.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$? $((SECONDS - t0)) s"; tail -c 1500 "$OUT/ncu.err"; grep -c "triton_tem\|_attention_kernel" "$OUT/ncu_raw.csv"
