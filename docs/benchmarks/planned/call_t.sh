#!/usr/bin/env bash
# Call T (docs/benchmarks/planned/README.md): the Triton triangle attention (the bias as the first dot's
# accumulator; the next key block's dot issued ahead of the softmax, AHEAD; every second block's
# exponentials on the FMA pipes, EXP_SPLIT), every launch setting of TRITON_GRID beside flex at N=2,048:
# TFLOP/s and each setting's largest difference from flex's output.
#   OUT=DIR bash docs/benchmarks/planned/call_t.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}/callT
source docs/benchmarks/planned/script_env.sh
cat "$OUT/env.txt"
t0=$SECONDS
timeout "${T_LIMIT_S:-200}" python3 scripts/flex_microbench.py --n 2048 --cases triton --out "$OUT/tattn.json" \
  > "$OUT/tattn.log" 2>&1
echo "tattn rc=$? $((SECONDS - t0)) s"; tail -c 1500 "$OUT/tattn.log"
