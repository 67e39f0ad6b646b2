#!/usr/bin/env bash
# The one place that installs NVIDIA BioNeMo's Fold-CP (NVIDIA-BioNeMo/boltz-cp), the context-parallel
# Boltz-2 behind model=foldcp/boltz2 (docs/peers.md).
#
#   bash scripts/install_foldcp.sh                          # into .venv-foldcp, from GitHub at FOLDCP_REF
#   FOLDCP_SRC=../foldcp-src bash scripts/install_foldcp.sh # from a local clone (its HEAD, or FOLDCP_REF)
#   FOLDCP_SRC=git+https://host/fork.git FOLDCP_REF=main bash scripts/install_foldcp.sh
#   FOLDCP_SRC=../foldcp-src bash scripts/install_foldcp.sh --gpu-wheels [DIR]   # wheels for the GPU machine
#
# Fold-CP installs as the distribution `boltz` 2.2.1: the import name (and version) of the stock
# Boltz-2 package that model=stock/boltz2 runs (scripts/install_stock.sh puts it into .venv). One
# environment holds one `boltz`, so Fold-CP goes into a venv of its own (VENV, default .venv-foldcp),
# made by scripts/setup.sh with cpbench installed editable; the script refuses a venv that holds the
# stock package unless REPLACE_STOCK=1.
#
# As with the stock models, the package goes in with --no-deps (its pins: numpy<2, hydra-core 1.3.2,
# pytorch-lightning, wandb, ... are for its training and data pipelines), plus only what the
# import of its trunk and data helpers needs (found by importing them in an empty environment):
#   einops, scipy                     boltz.model.layers (initialize: scipy.stats.truncnorm)
#   mashumaro, rdkit                  boltz.data.types (Fold-CP's feature placements and collate import it;
#                                     rdkit for its `Mol` type: cpbench's `real` extra has it too, so a venv
#                                     made by scripts/setup.sh hid the need until the GPU machine, 2026-12-05)
#   cuequivariance_torch 0.8.0        pure Python, no kernels: boltz's serial triangle attention runs
#   (+ cuequivariance, opt-einsum)    find_spec("cuequivariance_torch.primitives.triangle") at import,
#                                     which raises ModuleNotFoundError when the package is absent.
# The CUDA kernels (cuequivariance_ops_torch_cu12/13, trifast) are Fold-CP's `cuda` extra: install them
# on a GPU machine for model.tri_attn_backend=cueq|trifast (pip install "boltz[cuda]" pins them).
#
# Installed through a git URL (a local clone as git+file://) so that pip records the commit
# (direct_url.json), which every result.json of model=foldcp/boltz2 names.
#
# --gpu-wheels puts what the H200 machine (Python 3.12, no package index) lacks for
# model=foldcp/boltz2 into DIR (default .whl/foldcp; scripts/gpu_campaign.sh installs them into a
# site of their own, apart from the stock boltz of .whl/stock): a wheel of Fold-CP built from the
# source, the pure-Python packages above, scipy and rdkit (cp312 manylinux wheels, 36 and 35 MB: together
# over the 64 MiB one device call carries, so they go over in two calls to a warm machine), trifast (its Triton
# triangle attention: model.tri_attn_backend=trifast) with jaxtyping, wadler-lindig, platformdirs,
# and commit.txt (a wheel records no commit; the campaign passes it on as CPBENCH_FOLDCP_COMMIT).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-foldcp}
FOLDCP_SRC=${FOLDCP_SRC:-https://github.com/NVIDIA-BioNeMo/boltz-cp.git}
# The commit the adapter was written against (a later one may work: FOLDCP_REF=main).
PINNED_REF=15f9775bc2280cd8a9338feb4d29511c27beaf21
DEPS=(einops scipy mashumaro rdkit "cuequivariance_torch==0.8.0" "cuequivariance==0.8.0")

if [ -d "$FOLDCP_SRC" ]; then
  src=$(cd "$FOLDCP_SRC" && pwd)
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    ref=$(git -C "$src" rev-parse "${FOLDCP_REF:-HEAD}")
    [ -z "$(git -C "$src" status --porcelain --untracked-files=no)" ] ||
      echo "install_foldcp.sh: $src has uncommitted changes; installing its commit $ref without them" >&2
    requirement="git+file://$src@$ref" commit=$ref
  else
    requirement="$src" commit=unknown  # a plain directory: pip records no commit
  fi
else
  url=${FOLDCP_SRC#git+}
  commit=${FOLDCP_REF:-$PINNED_REF}
  requirement="git+$url@$commit"
fi

if [ "${1:-}" = "--gpu-wheels" ]; then
  dir=${2:-.whl/foldcp}
  mkdir -p "$dir"
  python3 -m pip wheel -q --no-deps -w "$dir" "$requirement"
  echo "$commit" > "$dir/commit.txt"
  python3 -m pip download -q --no-deps -d "$dir" mashumaro "cuequivariance_torch==0.8.0" "cuequivariance==0.8.0" \
    opt-einsum trifast jaxtyping wadler-lindig platformdirs
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$dir" scipy rdkit
  python3 scripts/repack_wheels.py "$dir"
  ls -l "$dir"
  exit 0
fi

[ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import cpbench" 2>/dev/null || VENV="$VENV" bash scripts/setup.sh
if [ "${REPLACE_STOCK:-0}" != 1 ] && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('boltz') and not u.find_spec('boltz.distributed') else 1)"; then
  echo "install_foldcp.sh: $VENV holds the stock boltz (model=stock/boltz2), which Fold-CP would replace under the same name;" \
       "use another VENV (default .venv-foldcp) or REPLACE_STOCK=1" >&2
  exit 2
fi

PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --no-deps --force-reinstall "$requirement"
"${PIP[@]}" "${DEPS[@]}"
# pip's resolver lists the pins of the --no-deps package as conflicts: expected, they are not used.
"$VENV/bin/python" -m cpbench.models.foldcp
