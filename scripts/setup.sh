#!/usr/bin/env bash
# Create .venv in the repository root and install cpbench (editable) with its test extra.
# torch is installed only when the interpreter has none: TORCH_SPEC overrides the pin
# (e.g. TORCH_SPEC="torch==2.11.0" or a CUDA wheel index of your site).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-test,real}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
fi
"$VENV/bin/python" -m pip install -q -e ".[${EXTRAS}]"
"$VENV/bin/python" -c "import torch, hydra, cpbench; print('cpbench', cpbench.__version__, '| torch', torch.__version__, '| hydra', hydra.__version__)"
