"""Adapters for the stock single-GPU trunks: Boltz-2, OpenFold3, Protenix (``model=stock/*``).

Each builds the trunk module of the installed package (``scripts/install_stock.sh``) with random
weights at its published sizes and runs it the way that project predicts (its precision,
chunking and optional kernels) or trains it (forward, backward, AdamW), behind the same three
hooks as any adapter (``cpbench/models/api.py``). They are single-GPU baselines: cp=1 only.

* ``packages.py``: which module each adapter imports, the version it was written against, and
  the one-line error naming the install command when it does not import (torch-free).
* ``adapter.py``: what they share (inputs, inference and training steps, ``run_blocks``, stats).
* ``boltz2.py``, ``openfold3.py``, ``protenix.py``: how each project builds and calls its trunk.

Public API: ``STOCK_PACKAGES``, ``stock_model_of`` (the stock package a model config runs, or None).
"""

from cpbench.models.stock.packages import STOCK_PACKAGES, stock_model_of

__all__ = ["STOCK_PACKAGES", "stock_model_of"]
