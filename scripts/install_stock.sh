#!/usr/bin/env bash
# The one place that installs the stock models behind model=stock/* (docs/stock_models.md).
#
#   bash scripts/install_stock.sh [boltz2] [openfold3] [protenix] [all]   # into .venv (VENV=...)
#   bash scripts/install_stock.sh --gpu-wheels [DIR]                      # wheels for the GPU machine
#
# Their packages pin old or conflicting versions (boltz 2.2.1: numpy<2, hydra-core 1.3.2,
# scipy 1.13.1, ...; protenix 2.0.0: torch 2.7.1, triton 3.3.1, deepspeed ...), and the trunk
# modules need none of that. So each package goes in with --no-deps, plus only the packages the
# import of its trunk module needs (found by importing it in an empty environment):
#
#   boltz2     boltz==2.2.1 (boltz.model.layers.pairformer)             + einops, scipy
#   openfold3  openfold3==0.5.0 (openfold3.core.model.latent.pairformer) + ml-collections, biotite
#              (openfold3/__init__ imports gemmi: the `real` extra of scripts/setup.sh has it)
#   protenix   protenix==2.0.0 (protenix.model.modules.pairformer)      + scipy, optree
#
# protenix's wheel also puts top-level `tests`, `runner`, `scripts` and `configs` packages into
# site-packages; a regular `tests` package there hides this repository's `tests` namespace
# package, so only its `protenix` package (and its dist-info) is moved into site-packages.
#
# --gpu-wheels downloads what the H200 machine (Python 3.12, no index; ../shared/gpu/README.md)
# lacks for model=stock/boltz2 into DIR (default .whl/stock; scripts/gpu_campaign.sh
# installs them there): boltz 2.2.1 (pure Python) and scipy (a cp312 manylinux wheel, ~34 MiB: the
# one binary wheel, boltz's layers import scipy.stats.truncnorm; einops and numpy are there).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
BOLTZ=boltz==2.2.1
OPENFOLD3=openfold3==0.5.0
PROTENIX=protenix==2.0.0

if [ "${1:-}" = "--gpu-wheels" ]; then
  dir=${2:-.whl/stock}
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps -d "$dir" "$BOLTZ"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$dir" scipy
  ls -l "$dir"
  exit 0
fi

PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(boltz2)
[ "${models[*]}" = "all" ] && models=(boltz2 openfold3 protenix)
for model in "${models[@]}"; do
  case "$model" in
    boltz2)
      "${PIP[@]}" --no-deps "$BOLTZ"
      "${PIP[@]}" einops scipy
      ;;
    openfold3)
      "${PIP[@]}" --no-deps "$OPENFOLD3"
      "${PIP[@]}" ml-collections biotite gemmi
      ;;
    protenix)
      site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
      tmp=$(mktemp -d)
      "${PIP[@]}" --no-deps --target "$tmp" "$PROTENIX"
      rm -rf "$site/protenix" "$site"/protenix-*.dist-info
      mv "$tmp/protenix" "$tmp"/protenix-*.dist-info "$site/"
      rm -rf "$tmp"
      "${PIP[@]}" scipy optree
      ;;
    *) echo "install_stock.sh: unknown model $model (allowed: boltz2, openfold3, protenix, all)" >&2; exit 2 ;;
  esac
done
# pip's resolver lists the pins of the --no-deps packages as conflicts: expected, they are not used.
"$VENV/bin/python" -m cpbench.models.stock "${models[@]}"
