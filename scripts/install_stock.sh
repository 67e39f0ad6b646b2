#!/usr/bin/env bash
# The one place that installs the stock models behind model=stock/* (docs/stock_models.md).
#
#   bash scripts/install_stock.sh [boltz2] [openfold3] [protenix] [all]   # into .venv (VENV=...)
#   bash scripts/install_stock.sh --gpu-wheels [DIR] [MODEL...]           # wheels for the GPU machine
#
# Their packages pin old or conflicting versions (boltz 2.2.1: numpy<2, hydra-core 1.3.2,
# scipy 1.13.1, ...; protenix 2.0.0: torch 2.7.1, triton 3.3.1, deepspeed ...), and the trunk
# modules need none of that. So each package goes in with --no-deps, plus only the packages the
# import of its trunk module needs (found by importing it in an empty environment):
#
#   boltz2     boltz==2.2.1 (boltz.model.layers.pairformer)             + einops, scipy
#   openfold3  openfold3==0.5.0 (openfold3.core.model.latent.pairformer) + ml-collections, biotite
#              (openfold3/__init__ imports gemmi: the `real` extra of scripts/setup.sh has it)
#   protenix   protenix==2.0.0 (protenix.model.modules.pairformer)      + scipy, optree, rdkit
#              (the pairformer imports protenix.data.constants, which imports rdkit.Chem: the `real`
#              extra of scripts/setup.sh has it too, which hid the need until the GPU machine, 2026-12-06)
#
# protenix's wheel also puts top-level `tests`, `runner`, `scripts` and `configs` packages into
# site-packages; a regular `tests` package there hides this repository's `tests` namespace
# package, so only its `protenix` package (and its dist-info) is moved into site-packages.
#
# --gpu-wheels downloads what the H200 machine (Python 3.12, no index; ../shared/gpu/README.md)
# lacks for the MODELs (default boltz2) into DIR (default .whl/stock; scripts/gpu_campaign.sh
# installs DIR/*.whl and DIR/*/*.whl there; torch, numpy, einops and PyYAML are on the image):
#
#   boltz2     boltz 2.2.1 (pure Python) and scipy (cp312, ~36 MB: boltz's layers import
#              scipy.stats.truncnorm)
#   openfold3  openfold3 0.5.0 (pure), ml-collections, absl-py, and the binary biotite 1.6.0 (the
#              version the CPU tests run; ~56 MB),
#              biotraj, msgpack, gemmi, scipy (cp312)
#   protenix   protenix 2.0.0 (pure), scipy, optree and rdkit (cp312; rdkit ~35 MB)
#
# One device call carries at most 64 MiB with the repository (~10.5 MB), so wheels over 5 MB are
# repacked LZMA-compressed (scripts/repack_wheels.py) and the wheels are
# packed into DIR/part1, DIR/part2, ... of at most PART_MB (default 55) MB each, largest first:
# carry one part per call to the same warm machine (its ignored files stay between calls), and run the
# campaign with the last (docs/stock_models.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
BOLTZ=boltz==2.2.1
OPENFOLD3=openfold3==0.5.0
PROTENIX=protenix==2.0.0

if [ "${1:-}" = "--gpu-wheels" ]; then
  dir=${2:-.whl/stock}
  shift $(( $# >= 2 ? 2 : 1 ))
  gpu_models=("$@")
  [ ${#gpu_models[@]} -gt 0 ] || gpu_models=(boltz2)
  [ "${gpu_models[*]}" = "all" ] && gpu_models=(boltz2 openfold3 protenix)
  pure=() binary=(scipy)
  for model in "${gpu_models[@]}"; do
    case "$model" in
      boltz2) pure+=("$BOLTZ") ;;
      openfold3) pure+=("$OPENFOLD3" ml-collections absl-py); binary+=("biotite==1.6.0" biotraj msgpack gemmi) ;;
      protenix) pure+=("$PROTENIX"); binary+=(optree rdkit) ;;
      *) echo "install_stock.sh: unknown model $model (allowed: boltz2, openfold3, protenix, all)" >&2; exit 2 ;;
    esac
  done
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "${pure[@]}"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$tmp" "${binary[@]}"
  rm -rf "$dir" && mkdir -p "$dir"
  python3 scripts/repack_wheels.py "$tmp"
  python3 - "$tmp" "$dir" "${PART_MB:-55}" <<'PY'
import pathlib, shutil, sys
src, dst, limit = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), float(sys.argv[3]) * 1e6
parts: list[list[pathlib.Path]] = []
for wheel in sorted(src.glob("*.whl"), key=lambda p: -p.stat().st_size):  # first fit, largest first
    size = wheel.stat().st_size
    part = next((p for p in parts if sum(w.stat().st_size for w in p) + size <= limit), None)
    if part is None:
        parts.append(part := [])
    part.append(wheel)
for i, part in enumerate(parts, 1):
    folder = dst / f"part{i}"
    folder.mkdir(parents=True)
    for wheel in part:
        shutil.move(str(wheel), folder / wheel.name)
    print(f"{folder}: {sum(w.stat().st_size for w in folder.iterdir()) / 1e6:.1f} MB, "
          + ", ".join(sorted(w.name.split('-')[0] for w in folder.iterdir())))
PY
  rm -rf "$tmp"
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
      "${PIP[@]}" scipy optree rdkit
      ;;
    *) echo "install_stock.sh: unknown model $model (allowed: boltz2, openfold3, protenix, all)" >&2; exit 2 ;;
  esac
done
# pip's resolver lists the pins of the --no-deps packages as conflicts: expected, they are not used.
"$VENV/bin/python" -m cpbench.models.stock "${models[@]}"
