"""Adapter for NVIDIA BioNeMo's Fold-CP (``NVIDIA-BioNeMo/boltz-cp``): context-parallel Boltz-2
(``model=foldcp/boltz2``), a peer CP implementation run by the same probe and timing routines as
the reference trunk. Fold-CP is installed, never vendored: ``scripts/install_foldcp.sh`` puts it
into a venv of its own, since it installs under the stock Boltz-2 package's name (``docs/peers.md``).

* ``package.py``: is Fold-CP installed, its version and commit, which kernel backends run here (torch-free).
* ``manager.py``: cpbench's 2D mesh mapped onto Fold-CP's ``DistributedManager``.
* ``inputs.py``: the trunk's inputs, the same global tensors at any cp, placed as Fold-CP places them.
* ``adapter.py``: the three hooks (inference, training), the config checks, the stats.

Public API: ``is_foldcp_installed``, ``version_label``.
"""

from cpbench.models.foldcp.package import is_foldcp_installed, version_label

__all__ = ["is_foldcp_installed", "version_label"]
