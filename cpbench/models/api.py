"""The adapter protocol: the three hooks cpbench calls to benchmark a CP model.

Any workload is an object (or a module) with::

    build_model(mesh: DeviceMesh, device: torch.device) -> nn.Module
    build_batch(N: int, n_atoms: int, S: int, mesh: DeviceMesh, device: torch.device) -> Any
    run_step(model, batch, train: bool) -> Tensor | None

``run_step`` is one whole step: inference = forward (+ sampling); training = forward,
backward and optimizer step (the adapter owns its optimizer) and returns the global loss,
the same value on every rank. The harness seeds torch identically on every rank before
``build_model`` and before ``build_batch``. The mesh is 1-D ``("cp",)`` for topology 1d and
2-D ``("cp0", "cp1")`` for 2d.

Optional extensions, used when present:

* ``run_step(model, batch, train, run_blocks=k)``: run only ``k`` trunk blocks (all weights
  still allocated); lets the probe shorten inference steps (``probe.depth``).
* ``run_step(model, batch, train, lean=True)``: run the step with the smallest transient
  buffers the model allows, so that its peak is the model's irreducible memory at this N; the
  probe's ``predict`` strategy fits these peaks to predict the max N (``probe.strategy``).
* ``stats() -> dict``: measurements of the last step, e.g. ``{"stage_ms": {"trunk": ..},
  "comm_bytes_per_block": ..}``; copied into the result record. Optional keys the report reads:
  ``stage_ms`` (ms per stage), ``stage_peak_gib`` (peak allocated GiB per stage, e.g.
  ``{"embedding": .., "trunk": .., "sampling": ..}`` or ``{"forward": .., "backward_optimizer":
  ..}``; omit it where it is not measured -- the reference adapter records it on CUDA only,
  resetting the peak counter at each stage start, so the worker takes the run's peak as the max
  of its own reading and these stage peaks), ``comm_bytes_per_block``, ``comm_share``,
  ``comm_step`` (``{kind: {"calls", "bytes"}}``, kinds ``all_gather``, ``reduce_scatter``,
  ``all_reduce``, ``all_to_all``, ``p2p``: what the link model prices). Without ``comm_step`` the
  harness counts the step's collectives itself in one untimed step after a timing's repeats
  (``cpbench.harness.collectives``).

Optional class-level checks, run by the config validation before any job starts (the adapter
is not instantiated there):

* ``max_cp: int``: the largest CP size the adapter runs; ``cp=auto`` resolves to at most this
  (the stock single-GPU models of ``cpbench/models/stock/`` say 1).
* ``probe_depth: int``: the blocks per inference probe step that ``probe.depth=auto`` resolves to
  (else 1 on a GPU, 2 on a CPU); still verified against the full step at the first point. The
  stock Boltz-2 trunk says 2: its first block turns the bf16 input pair into fp32, so one block
  peaks a pair tensor below the rest.
* ``check_config(model: dict, cp: int, device: str, train: bool) -> None``: a classmethod or
  staticmethod that raises ``AdapterConfigError(key, value, allowed)`` for a configuration it
  cannot run (cp beyond ``max_cp``, a kernel this device lacks, a package that is not installed);
  the user sees it as one line ``cpbench: error: key=value: allowed``.

Hydra instantiates the adapter from the ``model`` config: ``_target_`` plus keyword sizes.
A ``_target_`` that names a module with the three functions at top level (the shape of the
fold-cp driver's adapters) works as well.
"""

from __future__ import annotations

import importlib
import inspect
import types
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the controller and the report import this without torch
    import torch
    from torch import nn

HOOKS = ("build_model", "build_batch", "run_step")
# Keys of the model config that describe the preset, not constructor arguments.
NON_KWARG_KEYS = ("name", "_target_")
# Keys the reference presets interpolate from the harness config (``dtype: ${dtype}``); passed
# to a user's adapter only when its constructor takes them.
HARNESS_KEYS = frozenset({"dtype", "recycles", "checkpointing", "lr", "sampling", "sampling_steps", "samples"})


@runtime_checkable
class Adapter(Protocol):
    """A benchmarkable CP workload (see the module docstring)."""

    def build_model(self, mesh: Any, device: torch.device) -> nn.Module: ...

    def build_batch(self, N: int, n_atoms: int, S: int, mesh: Any, device: torch.device) -> Any: ...

    def run_step(self, model: nn.Module, batch: Any, train: bool) -> torch.Tensor | None: ...


class AdapterError(ValueError):
    """The model config does not name a usable adapter."""


class AdapterConfigError(ValueError):
    """An adapter's ``check_config`` refuses a configuration: ``key=value: allowed`` (one line)."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value}: {allowed}")


def import_target(target: str) -> Any:
    """Import ``pkg.mod`` (a module) or ``pkg.mod.Attr`` (an attribute of a module)."""
    try:
        return importlib.import_module(target)
    except ImportError:
        pass
    module_name, _, attr = target.rpartition(".")
    if not module_name:
        raise AdapterError(f"model._target_={target!r}: cannot import it")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AdapterError(f"model._target_={target!r}: cannot import {module_name!r} ({exc})") from exc
    if not hasattr(module, attr):
        raise AdapterError(f"model._target_={target!r}: {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_adapter(model_cfg: dict) -> Adapter:
    """Build the adapter named by a resolved ``model`` config (a plain dict)."""
    target = model_cfg.get("_target_")
    if not target or target == "???":
        raise AdapterError("model._target_ is required: a class or module with build_model, build_batch, run_step")
    obj = import_target(str(target))
    kwargs = {k: v for k, v in model_cfg.items() if k not in NON_KWARG_KEYS}
    if isinstance(obj, types.ModuleType):
        adapter = obj
    elif callable(obj):
        adapter = obj(**_accepted_kwargs(obj, kwargs))
    else:
        raise AdapterError(f"model._target_={target!r} is neither a class, a factory nor a module")
    missing = [h for h in HOOKS if not callable(getattr(adapter, h, None))]
    if missing:
        raise AdapterError(f"model._target_={target!r} lacks the adapter hook(s) {', '.join(missing)}")
    return adapter


def _accepted_kwargs(factory: Any, kwargs: dict) -> dict:
    """Drop the harness keys (``HARNESS_KEYS``) the factory does not take; every other key is
    the user's and goes through, so a misspelt ``+model.key`` fails loudly."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params or k not in HARNESS_KEYS}


def _run_step_takes(adapter: Adapter, keyword: str) -> bool:
    """Whether the adapter's ``run_step`` has a parameter named ``keyword`` (an optional extension)."""
    try:
        return keyword in inspect.signature(adapter.run_step).parameters
    except (TypeError, ValueError):
        return False


def supports_run_blocks(adapter: Adapter) -> bool:
    """Whether ``run_step`` takes ``run_blocks`` (lets the probe run a shortened trunk)."""
    return _run_step_takes(adapter, "run_blocks")


def supports_lean(adapter: Adapter) -> bool:
    """Whether ``run_step`` takes ``lean`` (lets the probe fit irreducible peaks)."""
    return _run_step_takes(adapter, "lean")


def adapter_stats(adapter: Adapter) -> dict:
    """The adapter's optional measurements of its last step (``{}`` when it has none)."""
    stats = getattr(adapter, "stats", None)
    return dict(stats()) if callable(stats) else {}


def adapter_int_attr(model_cfg: dict, name: str) -> int | None:
    """An optional class-level int its adapter declares (``max_cp``, ``probe_depth``: see the
    module docstring); None when it declares none or its ``_target_`` does not import (the config
    check reports that on its own)."""
    if not isinstance(model_cfg, dict):
        return None
    try:
        obj = import_target(str(model_cfg.get("_target_")))
    except AdapterError:
        return None
    value = getattr(obj, name, None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def adapter_max_cp(model_cfg: dict) -> int | None:
    """The ``max_cp`` its adapter declares, or None."""
    return adapter_int_attr(model_cfg, "max_cp")


def check_adapter_config(model_cfg: dict, cp: int, device: str, train: bool) -> None:
    """Run the adapter's optional ``check_config`` (see the module docstring).

    Raises:
        AdapterConfigError: the adapter refuses this configuration.
    """
    check = getattr(import_target(str(model_cfg.get("_target_"))), "check_config", None)
    if callable(check):
        check(dict(model_cfg), cp=cp, device=device, train=train)
