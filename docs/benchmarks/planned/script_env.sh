# Sourced by the planned calls that run scripts, not cpbench jobs (call_a.sh, call_s.sh), from the
# repository root with OUT set to their folder: the pure-Python wheels of .whl/ into /tmp/site, the
# tree and scripts/ on the path, and the commit and the machine (GPU, torch, Triton) in $OUT.
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts PYTHONUNBUFFERED=1
[ -f commit.txt ] && cp commit.txt "$OUT/"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$OUT/env.txt" 2>&1
