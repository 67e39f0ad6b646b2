#!/usr/bin/env bash
# Run a file of cpbench jobs on a GPU machine that reaches no package index, into one folder.
# This is the one script a GPU campaign needs: what to run lives in the campaign file.
#
#   OUT=/path/to/results BUDGET_S=590 bash scripts/gpu_campaign.sh CAMPAIGN_FILE
#
# CAMPAIGN_FILE has one job per line, NAME NEEDED_S OVERRIDES... (blank lines and # comments
# skipped), e.g. (docs/benchmarks/2026-12-03-h200-emulated/timing.txt):
#
#   t_cp1_real 120 model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing N=2048 cp=1
#   t_cp2_emu   90 model=boltz2 workflow.sampling=false workflow.recycles=0 model.msa_blocks=0 routine=timing N=2048 cp=2 emulate=true
#
# Each job runs `python3 -m cpbench OVERRIDES hydra.run.dir=$OUT/NAME` (a line whose overrides
# start with -m runs a multirun into hydra.sweep.dir=$OUT/NAME) when at least NEEDED_S seconds of
# BUDGET_S remain, else it is skipped with a line saying so. A job still running 5 s before the
# budget ends is stopped (its supervisor stops its workers). A probe keeps its probe_state.json,
# so the same line continues it in a later run once its folder is carried back: RESUME_FROM=DIR
# copies DIR/NAME to $OUT/NAME first (less its result.json).
#
# Set up first (once per checkout): the pure-Python wheels cpbench needs beyond torch
# (hydra-core, omegaconf, antlr4, submitit, hydra-submitit-launcher) in .whl/ of the repository
# (ignored by git), and for model=stock/* lines the stock packages' wheels in .whl/stock/ or its
# part folders (`bash scripts/install_stock.sh --gpu-wheels .whl/stock MODEL...`). They are installed into /tmp/site, and
# cpbench runs from the tree. For model=foldcp/* lines, Fold-CP's wheels in .whl/foldcp/
# (`bash scripts/install_foldcp.sh --gpu-wheels`) go into /tmp/site-foldcp, first on the path of
# those lines only (Fold-CP installs as `boltz`, the stock Boltz-2's name). A tree without .git
# names its commit in commit.txt, which goes into every result.json (CPBENCH_GIT_COMMIT).
#
# Compiled code is kept across calls: Inductor's and Triton's caches live in COMPILE_CACHE
# (default ~/.cache/cpbench-compile, outside $OUT, so it stays on a machine held from call to call;
# TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR point into it), and RESUME_FROM/compile_cache.tgz,
# when a later call carries one back, is unpacked there first. With KEEP_COMPILE_CACHE=1 the
# campaign ends by writing $OUT/compile_cache.tgz (at most 15 MiB, the size a call hands back; a
# larger one is left out with a line saying so). A probe point whose N ran before on that GPU model
# (an end re-run in a later call) then skips most of its compile: a training point near cp=2's
# limit spent 165 of its 309 s compiling.
#
# EXPECT_GPU=NAME runs nothing (exit 3, $OUT/refused.txt) unless the GPU's name contains NAME.
# ONLY=NAME[,NAME...] runs only those lines of the file (e.g. one line of a side-by-side campaign
# when a call has too little time for the rest); a name with no line refuses the run (exit 2).
#
# Written to $OUT: each job's folder and log ($OUT/NAME.log), env.txt (GPU, driver, clocks,
# torch/CUDA/NCCL), nvidia-smi before and after, commit.txt, and one archive of it all
# ($OUT/all.tgz: a machine that hands back only a few files still returns every result).
set -uo pipefail
cd "$(dirname "$0")/.."
CAMPAIGN=${1:?usage: OUT=DIR BUDGET_S=S bash scripts/gpu_campaign.sh CAMPAIGN_FILE}
OUT=${OUT:?set OUT}
BUDGET_S=${BUDGET_S:-590}
START=$(date +%s)
mkdir -p "$OUT"
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
# ONLY names lines of the file: a name that matches none is a typo, refused before anything runs
only=${ONLY:-}
for name in ${only//,/ }; do
  grep -qE "^${name}[[:space:]]" "$CAMPAIGN" || { echo "ONLY=$only: $CAMPAIGN has no line named '$name'"; exit 2; }
done
# EXPECT_GPU=H200: run nothing unless the first GPU's name contains it (a call for one GPU model can
# land on another: an H200 probe on an H100 measures an H100 figure)
if [ -n "${EXPECT_GPU:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *"$EXPECT_GPU"*) ;;
    *) echo "EXPECT_GPU=$EXPECT_GPU: this machine's GPU is '${gpu:-none}': nothing run" | tee "$OUT/refused.txt"; exit 3;;
  esac
fi

if ! python3 -c "import hydra, submitit" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || { echo "cannot install .whl/*.whl"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
stock_wheels=$(compgen -G ".whl/stock/*.whl"; compgen -G ".whl/stock/*/*.whl")  # its parts, carried call by call
if [ -n "$stock_wheels" ]; then  # the stock models' packages (model=stock/*)
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $stock_wheels \
    || { echo "cannot install .whl/stock's wheels"; exit 1; }
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
if compgen -G ".whl/foldcp/*.whl" > /dev/null; then  # Fold-CP (model=foldcp/*), apart from the stock boltz
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-foldcp .whl/foldcp/*.whl \
    || { echo "cannot install .whl/foldcp/*.whl"; exit 1; }
  [ -f .whl/foldcp/commit.txt ] && export CPBENCH_FOLDCP_COMMIT=$(cat .whl/foldcp/commit.txt)
fi
export PYTHONUNBUFFERED=1
cache=${COMPILE_CACHE:-$HOME/.cache/cpbench-compile}
mkdir -p "$cache"
export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
if [ -n "${RESUME_FROM:-}" ] && [ -f "$RESUME_FROM/compile_cache.tgz" ]; then
  tar xzf "$RESUME_FROM/compile_cache.tgz" -C "$cache" && echo "compile cache from $RESUME_FROM: $(du -sh "$cache" | cut -f1)"
fi
# the tree may have no .git: its commit (commit.txt, when present) goes into every result.json
if [ -f commit.txt ]; then export CPBENCH_GIT_COMMIT=$(cat commit.txt); cp commit.txt "$OUT/"; fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
nvidia-smi > "$OUT/nvidia-smi_before.txt" 2>&1

while read -r name need args; do
  [ -z "${name:-}" ] || [ "${name#\#}" != "$name" ] && continue
  case ",${ONLY:-$name}," in *",$name,"*) ;; *) continue;; esac
  if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left) s left, needs $need"; continue; fi
  if [ -n "${RESUME_FROM:-}" ] && [ -d "$RESUME_FROM/$name" ]; then
    cp -r "$RESUME_FROM/$name" "$OUT/$name" && rm -f "$OUT/$name/result.json"
  fi
  dir_key=hydra.run.dir; case "$args" in -m\ *) dir_key=hydra.sweep.dir;; esac
  t0=$(date +%s)
  # shellcheck disable=SC2086  # the overrides are words
  path=$PYTHONPATH; case "$args" in *model=foldcp/*) path=/tmp/site-foldcp:$PYTHONPATH;; esac
  PYTHONPATH=$path timeout $(( $(left) - 5 )) python3 -m cpbench $args "$dir_key=$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "job $name rc=$? $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/$name.log" | cut -c1-500)"
  grep -h "probe N=\|probe verify\|predicted\|depth check" "$OUT/$name.log" | cut -c1-300
done < "$CAMPAIGN"

nvidia-smi > "$OUT/nvidia-smi_after.txt" 2>&1
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$OUT.tgz" "$OUT/all.tgz"
if [ "${KEEP_COMPILE_CACHE:-0}" = 1 ]; then
  tar czf "$OUT/compile_cache.tgz" -C "$cache" .
  size=$(stat -c %s "$OUT/compile_cache.tgz")
  if [ "$size" -gt $(( 15 * 1024 * 1024 )) ]; then
    echo "compile cache: $(( size >> 20 )) MiB packed, over the 15 MiB a call hands back: left out"
    rm -f "$OUT/compile_cache.tgz"
  else
    echo "compile cache: $(( size >> 10 )) KiB packed in $OUT/compile_cache.tgz"
  fi
fi
echo "done in $(( $(date +%s) - START )) s"
