"""The stock packages behind ``model=stock/*``: which trunk module each adapter imports, the
version it was written against, and the one line that says how to install it.

Torch-free until ``import_trunk_module`` runs: the controller reads this table to check a
config, and the report reads ``STOCK_PACKAGES`` for the names it prints.

    python -m cpbench.models.stock boltz2 openfold3   # import each trunk module, one line each
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, field
from types import ModuleType

INSTALL_SCRIPT = "bash scripts/install_stock.sh"
# The adapters' Hydra targets live here; a model config whose _target_ starts with it is stock.
TARGET_PREFIX = "cpbench.models.stock."


class StockPackageError(ImportError):
    """A stock trunk module that does not import; the message is one line naming the install."""


@dataclass(frozen=True)
class StockPackage:
    """One stock model: ``model=stock/<model>``."""

    model: str                 # "boltz2"
    title: str                 # "Boltz-2", as in "the stock Boltz-2 trunk"
    distribution: str          # the PyPI name
    version: str               # the version the adapter was written against
    trunk_module: str          # the module that defines the stock trunk
    # Set (unless already set) before the import: Protenix JIT-compiles a CUDA layer norm at
    # import time unless LAYERNORM_TYPE says otherwise (it needs nvcc; its own CPU tests set it).
    environment: dict = field(default_factory=dict)
    # A module only another project's package of the same name has (Fold-CP installs as `boltz`
    # 2.2.1 too, with its CP code under boltz.distributed): its presence means "not the stock one".
    not_stock_if: str | None = None

    @property
    def install_command(self) -> str:
        return f"{INSTALL_SCRIPT} {self.model}"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


STOCK_PACKAGES = {p.model: p for p in (
    StockPackage("boltz2", "Boltz-2", "boltz", "2.2.1", "boltz.model.layers.pairformer", not_stock_if="boltz.distributed"),
    StockPackage("openfold3", "OpenFold3", "openfold3", "0.5.0", "openfold3.core.model.latent.pairformer"),
    StockPackage("protenix", "Protenix", "protenix", "2.0.0", "protenix.model.modules.pairformer",
                 environment={"LAYERNORM_TYPE": "torch"}),
)}


def stock_model_of(model_cfg: dict | None) -> StockPackage | None:
    """The stock package a model config runs (by its ``_target_``), None for any other model."""
    target = str((model_cfg or {}).get("_target_") or "")
    if not target.startswith(TARGET_PREFIX):
        return None
    module = target[len(TARGET_PREFIX):].split(".", 1)[0]
    return STOCK_PACKAGES.get(module)


def installed_version(package: StockPackage) -> str | None:
    """The installed distribution's version, None when pip does not know it."""
    try:
        return importlib.metadata.version(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def module_present(name: str) -> bool:
    """Whether ``name`` can be found without importing it (False where a parent package is missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_trunk_module(model: str) -> ModuleType:
    """Import the stock trunk module of ``model`` (a key of ``STOCK_PACKAGES``).

    Raises:
        StockPackageError: one line: what failed to import and the command that installs it.
    """
    package = STOCK_PACKAGES[model]
    for key, value in package.environment.items():
        os.environ.setdefault(key, value)
    if package.not_stock_if and module_present(package.not_stock_if):
        raise StockPackageError(
            f"the installed {package.distribution} is not the stock {package.title} package (it has {package.not_stock_if}: "
            f"Fold-CP's, docs/peers.md); run model=stock/{model} from a venv with {package.install_command}")
    try:
        return importlib.import_module(package.trunk_module)
    except (ImportError, OSError, RuntimeError) as exc:  # OSError: a JIT build at import (Protenix)
        cause = " ".join(str(exc).split())[:200]
        raise StockPackageError(
            f"{package.trunk_module} does not import ({type(exc).__name__}: {cause}); "
            f"install {package.requirement} and what its trunk imports with: {package.install_command}") from None


def main(argv: list[str]) -> int:
    """Import each named stock trunk (default: all); one line each; exit code 1 if one failed."""
    models = [m for m in argv if m != "all"] or list(STOCK_PACKAGES)
    failed = 0
    for model in models:
        package = STOCK_PACKAGES[model]
        try:
            import_trunk_module(model)
        except StockPackageError as exc:
            print(f"stock/{model}: {exc}")
            failed = 1
            continue
        print(f"stock/{model}: {package.trunk_module} imports ({package.distribution} {installed_version(package)})")
    return failed
