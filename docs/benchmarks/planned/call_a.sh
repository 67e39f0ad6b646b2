#!/usr/bin/env bash
# Call A (docs/benchmarks/planned/README.md): the Triton kernels' first GPU checks, in one device call.
#   OUT=DIR bash docs/benchmarks/planned/call_a.sh
# 1. parity of the Triton passes and the Triton attention against torch at N=256 (inference and
#    training, fp32 and bf16, block and trunk); 2. the Triton attention's launch settings beside
#    flex at N=2,048 (TFLOP/s); 3. the forward passes' launch settings at N=2,048.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}/callA
source docs/benchmarks/planned/script_env.sh
cat "$OUT/env.txt"
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" python3 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? $((SECONDS - t0)) s"; tail -3 "$OUT/$name.log"; }
run parity 150 scripts/kernel_parity.py --n 256 --backends flex+triton flex+triton+tattn --out "$OUT/kernel_parity.json"
run tattn 150 scripts/flex_microbench.py --n 2048 --cases triton --out "$OUT/tattn.json"
run tune 150 scripts/tune_triton_passes.py --n 2048 --out "$OUT/tune.json"
