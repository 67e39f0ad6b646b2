"""The installed Fold-CP package behind ``model=foldcp/boltz2``: whether its trunk imports, which
version and commit it is, and which triangle-attention backends this machine can run.

Fold-CP (``NVIDIA-BioNeMo/boltz-cp``) installs as the distribution ``boltz`` 2.2.1, the name and
version of the stock Boltz-2 package; what tells them apart is ``boltz.distributed`` (Fold-CP's CP
code). ``scripts/install_foldcp.sh`` installs it into a venv of its own (``docs/peers.md``).

Torch-free until ``import_trunk`` runs: the controller reads it to check a config.

    python -m cpbench.models.foldcp        # import the trunk, one line: version and commit
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from types import ModuleType

from cpbench.models.stock.packages import module_present

INSTALL_COMMAND = "bash scripts/install_foldcp.sh"
COMMIT_ENV = "CPBENCH_FOLDCP_COMMIT"   # the commit, where the install recorded none (wheels)
REPOSITORY = "NVIDIA-BioNeMo/boltz-cp"
DISTRIBUTION = "boltz"
# The CP trunk (the 2D DTensor Pairformer) and the package that only Fold-CP has.
TRUNK_MODULE = "boltz.distributed.model.layers.pairformer"
CP_PACKAGE = "boltz.distributed"
# The 1D variant (a later Fold-CP than the commit the adapter was written against has it).
TRUNK_1D_MODULE = "boltz.distributed.model.layers.pairformer_1d"

# model.tri_attn_backend -> the module its kernel needs (None: plain PyTorch). Both kernels are
# CUDA-only; Fold-CP's own predict refuses them on a CPU.
TRI_ATTN_KERNEL_MODULES = {"reference": None, "trifast": "trifast", "cueq": "cuequivariance_ops_torch"}
TRI_ATTN_BACKENDS = ("auto", *TRI_ATTN_KERNEL_MODULES)
# model.pair_bias_backend -> Fold-CP's SDPAWithBiasBackend value (its ring attention with pair bias).
PAIR_BIAS_BACKENDS = {"auto": None, "reference": "reference", "torch_flex_attn": "torch_flex_attn"}


class FoldCPPackageError(ImportError):
    """Fold-CP's trunk does not import; the message is one line naming the install command."""


def kernels_label(kernels: dict[str, str]) -> str:
    """One label for the report's ``kernels`` column: the triangle-attention backend, ``+flex``
    where the pair-bias attention ran Fold-CP's flex path (``reference``, ``trifast+flex``)."""
    return kernels["tri_attn"] + ("+flex" if kernels["pair_bias"] == "torch_flex_attn" else "")


def chosen_kernels_label(model: dict) -> str | None:
    """``kernels_label`` of a config that names both backends (``model.tri_attn_backend``,
    ``model.pair_bias_backend``, neither ``auto``): what a point that failed before it recorded
    its kernels would have run; None where one was ``auto`` (resolved on the worker) or absent."""
    tri, pair = model.get("tri_attn_backend"), model.get("pair_bias_backend")
    if tri in (None, "auto") or pair in (None, "auto"):
        return None
    return kernels_label({"tri_attn": tri, "pair_bias": pair})


def is_foldcp_installed() -> bool:
    """Whether the installed ``boltz`` is Fold-CP's (it has ``boltz.distributed``)."""
    return module_present(CP_PACKAGE)


def import_trunk() -> ModuleType:
    """Import Fold-CP's DTensor Pairformer module (``TRUNK_MODULE``).

    Raises:
        FoldCPPackageError: one line: what failed and the command that installs it.
    """
    if module_present(DISTRIBUTION) and not is_foldcp_installed():
        raise FoldCPPackageError(f"the installed boltz is the stock Boltz-2 package (no {CP_PACKAGE}); "
                                 f"install Fold-CP into its own venv with: {INSTALL_COMMAND} (docs/peers.md)")
    try:
        return importlib.import_module(TRUNK_MODULE)
    except ImportError as exc:
        cause = " ".join(str(exc).split())[:200]
        raise FoldCPPackageError(f"{TRUNK_MODULE} does not import ({type(exc).__name__}: {cause}); "
                                 f"install Fold-CP ({REPOSITORY}) with: {INSTALL_COMMAND}") from None


def installed_commit() -> str | None:
    """The git commit Fold-CP was installed from: pip's ``direct_url.json`` (a ``git+`` URL records
    it, which ``install_foldcp.sh`` uses for a local clone too), else ``CPBENCH_FOLDCP_COMMIT``
    (``gpu_campaign.sh`` sets it from the wheels' ``commit.txt``: a wheel records none); or None."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        text = None
    commit = (json.loads(text).get("vcs_info") or {}).get("commit_id") if text else None
    return commit or os.environ.get(COMMIT_ENV) or None


def version_label() -> str:
    """``boltz 2.2.1 (Fold-CP 15f9775)``: what the result record names as the package."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    commit = installed_commit()
    return f"{DISTRIBUTION} {version} (Fold-CP {commit[:7] if commit else 'commit unknown'})"


def tri_attn_refusal(backend: str, device: str) -> str | None:
    """Why ``model.tri_attn_backend=backend`` cannot run on ``device`` here (None: it can)."""
    if backend not in TRI_ATTN_BACKENDS:
        return f"one of {', '.join(TRI_ATTN_BACKENDS)}"
    kernel_module = TRI_ATTN_KERNEL_MODULES.get(backend)
    if kernel_module is None:
        return None
    if device != "cuda":
        return "needs a CUDA device (Fold-CP's kernels are CUDA-only); on a CPU: reference or auto"
    if not module_present(kernel_module):
        return (f"needs the {kernel_module} package, which is not installed (Fold-CP's `cuda` extra); "
                "allowed here: reference or auto")
    return None


def resolve_tri_attn(backend: str, device: str) -> str:
    """``auto``: Fold-CP's predict default ``cueq`` where it can run here, else ``reference``."""
    if backend != "auto":
        return backend
    return "cueq" if tri_attn_refusal("cueq", device) is None else "reference"


def resolve_pair_bias(backend: str, device: str) -> str:
    """``auto``: Fold-CP's predict default ``torch_flex_attn`` on CUDA (its flex path takes CUDA
    tensors only), ``reference`` on a CPU."""
    if backend != "auto":
        return PAIR_BIAS_BACKENDS[backend]
    return "torch_flex_attn" if device == "cuda" else "reference"


def main() -> int:
    """Import the trunk; print one line (what imported, or why not); exit code 1 if it did not."""
    try:
        import_trunk()
    except FoldCPPackageError as exc:
        print(f"foldcp/boltz2: {exc}")
        return 1
    print(f"foldcp/boltz2: {TRUNK_MODULE} imports ({version_label()}; 1D trunk: "
          f"{'yes' if module_present(TRUNK_1D_MODULE) else 'no'})")
    return 0
