#!/usr/bin/env bash
# The stock Boltz-2 baseline on one H200 (#20), in one device call of about 550 s:
#   OUT=<dir> bash scripts/campaign_stock_h200.sh
#   1. the inference max-N probe of the stock Boltz-2 trunk (cp=1, one trunk pass per step:
#      workflow.recycles=0, bf16-mixed as boltz predict, kernels torch; predict strategy from 1,536,
#      depth 2 checked against all 64 blocks at the first point, bisected to 256 tokens, bounded by
#      an out-of-memory, the max N and the first failing N re-run: probe.verify), then
#   2. the 64-block pass at N=1,024 (routine=timing, same settings),
#   3. the report over both (python -m cpbench.report), everything under $OUT and in $OUT/all.tgz.
#
# Wheels: the machine has no index (../shared/gpu/README.md). Besides the wheels gpu_env.sh installs
# from .whl/*.whl (hydra-core, omegaconf, antlr4, submitit, hydra-submitit-launcher from
# ../shared/gpu/wheels), .whl/stock/ must hold exactly what boltz's trunk imports and the image lacks
# (it has torch, numpy and einops):
#   .whl/stock/boltz-2.2.1-py3-none-any.whl                                             268 KB, pure Python
#   .whl/stock/scipy-1.16.3-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl  35.7 MB, binary
# scipy is the one binary wheel (boltz.model.layers.initialize imports scipy.stats.truncnorm for
# its weight init; there is no pure-Python scipy), built for the machine's CPython 3.12 on x86_64.
# Fetch both here with:  bash scripts/install_stock.sh --gpu-wheels   (into .whl/stock/)
# and carry .whl (about 36 MiB of the 64 MiB a call carries; the tracked tree is about 7 MiB).
# cuEquivariance (Boltz's use_kernels) is not run: its CUDA 12 wheels fail to load there (no
# libnvrtc.so.12) and the CUDA 13 pair (71 MB) does not fit one call's tree (../shared/gpu/README.md).
#
# CPU rehearsal of the whole script (tiny trunk, same phases, no wheels): DRY=1 OUT=/tmp/x bash scripts/campaign_stock_h200.sh
set -u
OUT=${OUT:?set OUT}
BUDGET_S=${BUDGET_S:-550}
START=$(date +%s)
mkdir -p "$OUT"
source scripts/campaign_lib.sh  # left, point, archive_out

if [ "${DRY:-0}" = 1 ]; then  # CPU rehearsal: the tiny sizes, N scaled down, no GPU or wheels
  HERE="device=cpu dtype=fp32 model.c_s=32 model.c_z=16 model.blocks=3 model.heads_single=4 memory.limit_gib=0.25"
  N_TIMING=32; PROBE_START=32; GRANULARITY=64; PYTHON=${PYTHON:-.venv/bin/python}
else
  HERE="device=cuda"
  N_TIMING=1024; PROBE_START=1536; GRANULARITY=256; PYTHON=python3
  source scripts/gpu_env.sh > "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/stock/*.whl >> "$OUT/env.txt" 2>&1 || { cat "$OUT/env.txt"; exit 1; }
  cat "$OUT/env.txt"
  nvidia-smi > "$OUT/nvidia-smi_before.txt" 2>&1
fi
cat commit.txt > "$OUT/commit.txt" 2>/dev/null || git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
# One line per trunk module: boltz and its imports came in (a failure here names what is missing).
$PYTHON -m cpbench.models.stock boltz2 > "$OUT/stock_import.txt" 2>&1; rc=$?
$PYTHON -c "import scipy, numpy; print('scipy', scipy.__version__, 'numpy', numpy.__version__)" >> "$OUT/stock_import.txt" 2>&1
cat "$OUT/stock_import.txt"; [ $rc = 0 ] || exit 1

STOCK="model=stock/boltz2 model.kernels=torch cp=1 workflow=inference workflow.recycles=0 $HERE"

# The probe first (the figure the report compares against). No new probe point starts later than
# 200 s before the end. A point takes 30-50 s: the worker builds the 64 blocks with Boltz's own init
# (scipy truncnorm) before its step, ~30 s on the H200 machine (first call, 2026-12-01: N=512 31.5 s
# for a 1.8 s step). It starts at 1,536 with growth 1.5: the depth check there compares one block
# with all 64 (at N=512 the 64-block peak was 2.9 % above the 2-block one, over the 1 % tolerance:
# a constant ~0.06 GiB, bf16 copies of the blocks' weights that autocast keeps, which at 1,536 is
# ~0.4 % of the peak), and three ramp points (1,536, 2,304, 3,456) give the prediction. Then the
# timing: 8 steps of ~10 s plus the build (the first call's 90 s limit cut it), the report and the
# archive (~25 s).
# Depth 2, not the GPU default of 1: the stock module's first block takes the embedder's bf16 z and
# returns fp32 z (Boltz adds its bf16 updates to z with an fp32 dropout mask), so from the second
# block on every block holds fp32 pairs: at N=1,536 one block peaked at 10.90 GiB and all 64 at
# 12.09 GiB (second call, 2026-12-01), one fp32 z apart. Two blocks differ from 64 by the bf16
# weight copies autocast keeps (~1 MiB a block, 0.06 GiB at N=512: 2.9 % there, ~0.5 % at 1,536).
# SKIP_TIMING=1 leaves the timing out (a call that only continues the probe).
point stock_boltz2_probe 120 $STOCK routine=probe probe.start=$PROBE_START probe.growth=1.5 probe.depth=2 \
  probe.granularity=$GRANULARITY probe.strategy=predict probe.verify=true probe.timeout_s=150 \
  probe.budget_s=$(( $(left) - ${PROBE_RESERVE_S:-200} ))
grep -h "probe N=\|depth check\|predict\|verify\|bracket" "$OUT/stock_boltz2_probe.log" | cut -c1-300
[ "${SKIP_TIMING:-0}" = 1 ] || point stock_boltz2_pass$N_TIMING 45 $STOCK routine=timing N=$N_TIMING timing.timeout_s=$(( $(left) - 30 ))

t0=$(date +%s)
$PYTHON -m cpbench.report "$OUT" > "$OUT/report.log" 2>&1
echo "phase report rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/^## Headline/,/^## Results/p;/^## Memory model/,/^## FLOPs/p' "$OUT/cp_benchmark.md" 2>/dev/null | head -40
[ "${DRY:-0}" = 1 ] || nvidia-smi > "$OUT/nvidia-smi_after.txt" 2>&1
archive_out
