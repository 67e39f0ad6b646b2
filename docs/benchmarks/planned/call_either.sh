#!/usr/bin/env bash
# A call open to either GPU (kind nvidia-h200 without needs_h200): the CP curve's next step on whichever came.
#   OUT=DIR [RESUME_H200=DIR] [RESUME_H100=DIR] [SHORT=1] bash docs/benchmarks/planned/call_either.sh
# On an H200: TR2's cp=4 line (training_emulated_cp48.txt, ONLY=tr_cp4) into $OUT/tr2. On an H100: the emulated lines
# of the inference CP curve of one H100 (h100_curve.txt; its cp=1 line ran 2026-12-07, ../2026-12-07-h100-curve/) into
# $OUT/hc. RESUME_* name the folder an earlier call of the same line left (carried back), which the campaign continues
# (RESUME_FROM). SHORT=1, for a call with under ~450 s of device time: R4 on an H200 (ratio_short.txt, about 250 s)
# into $OUT/r, and on an H100 the curve's cp=2 line alone.
# Each call keeps its folder on the machine (~/keep/tr2, ~/keep/hc) and, while the machine is held, the next call
# continues from it without RESUME_*; it hands back the logs, all.tgz and the compile cache (compile_cache.tgz,
# KEEP_COMPILE_CACHE=1 of scripts/gpu_campaign.sh: put it in the RESUME_* folder of a call on a fresh machine).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT}
export KEEP_COMPILE_CACHE=${KEEP_COMPILE_CACHE:-1}
resume() { if [ -n "$2" ]; then echo "$2"; elif [ -d "$HOME/keep/$1" ]; then echo "$HOME/keep/$1"; fi; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "GPU: ${gpu:-none}"
case "${SHORT:-0}:$gpu" in
  1:*H200*) EXPECT_GPU=H200 OUT=$OUT/r BUDGET_S=${BUDGET_S:-265} \
            bash scripts/gpu_campaign.sh docs/benchmarks/planned/ratio_short.txt; dir=$OUT/r;;
  1:*H100*) ONLY=h100_cp2 RESUME_FROM=$(resume hc "${RESUME_H100:-}") OUT=$OUT/hc BUDGET_S=${BUDGET_S:-380} \
            bash scripts/gpu_campaign.sh docs/benchmarks/planned/h100_curve.txt; dir=$OUT/hc;;
  *H200*) RESUME_FROM=$(resume tr2 "${RESUME_H200:-}") ONLY=tr_cp4 EXPECT_GPU=H200 OUT=$OUT/tr2 BUDGET_S=${BUDGET_S:-555} \
            bash scripts/gpu_campaign.sh docs/benchmarks/planned/training_emulated_cp48.txt; dir=$OUT/tr2;;
  *H100*) ONLY=h100_cp2,h100_cp4,h100_cp8 RESUME_FROM=$(resume hc "${RESUME_H100:-}") OUT=$OUT/hc BUDGET_S=${BUDGET_S:-555} \
            bash scripts/gpu_campaign.sh docs/benchmarks/planned/h100_curve.txt; dir=$OUT/hc;;
  *) echo "no H200 or H100 here: nothing run"; exit 3;;
esac
rc=$?; echo "campaign rc=$rc"
sub=$(basename "$dir"); mkdir -p "$HOME/keep" && rm -rf "$HOME/keep/$sub" && cp -r "$dir" "$HOME/keep/$sub"
# a call hands back at most 8 files: the logs, all.tgz (every file) and the compile cache
find "$dir" -mindepth 1 -maxdepth 1 ! -name '*.log' ! -name all.tgz ! -name compile_cache.tgz -exec rm -rf {} +
for f in "$dir"/*.log; do
  echo "== $f"; grep -E "probe N=|probe ok|max N =|median|skipp|stopp|Error" "$f" | cut -c1-260 | tail -12
done
exit $rc
