#!/usr/bin/env bash
# Call S (docs/benchmarks/planned/README.md): which ops of the block keep the per-rank compute of an
# emulated cp=K pass above 1/K (2026-12-05, one H100: cp=2 took 0.67x the cp=1 time, cp=4 0.37x).
#   OUT=DIR bash docs/benchmarks/planned/call_s.sh
#   OUT=DIR S_CONFIGS="1;2" bash docs/benchmarks/planned/call_s.sh   (some of the configurations, ';'-separated)
# One block at N=2,048 on the Triton passes, op by op, with each op's 6 longest kernels: cp=1, then
# rank 0 of cp=2, cp=4 (1d) and 2x2, each its own process (the fake process group is process-wide).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}/callS
source docs/benchmarks/planned/script_env.sh
IFS=';' read -ra configs <<< "${S_CONFIGS:-1;2;4;4 --grid 2 2}"
for cfg in "${configs[@]}"; do
  name=cp${cfg// /_}; name=${name//--grid_/g}; t0=$SECONDS
  timeout 140 python3 scripts/profile_ops.py block --n 2048 --kernels flex+triton --kernel-rows 6 --cp $cfg \
    --out "$OUT/block_$name.json" > "$OUT/block_$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"; tail -c 400 "$OUT/block_$name.log"; echo
done
