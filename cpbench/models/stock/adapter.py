"""What the stock trunks' adapters share: the cp=1 check, the inputs, the step, the stats.

A stock adapter (``boltz2.py``, ``openfold3.py``, ``protenix.py``) builds the trunk module of an
installed package with random weights and says how that project calls it; this base class runs
it the same way for every project:

* **Inputs** (``build_batch``): what the trunk module consumes and nothing else -- the single
  and pair representations ``s: [1, N, c_s]`` and ``z: [1, N, N, c_z]`` in the dtype the
  projects' embedders hand them over in (their ``nn.Linear`` outputs: bf16 under ``dtype=bf16``'s
  autocast, fp32 under ``dtype=fp32``), the token mask ``mask: [1, N]`` and the pair mask
  ``pair_mask: [1, N, N]`` (fp32, as the projects compute them; all ones: every token is real).
  They are drawn on the device (the pair tensor is O(N²); a CPU copy would double the host's peak).
* **Inference**: ``recycles + 1`` passes of the trunk without autograd, each from a fresh copy
  of the inputs: the projects start every recycle from ``z = z_init + proj(z)``, so ``z_init``
  (here the batch's ``z``) and the trunk's working ``z`` live together during a pass. In the
  project's precision: ``dtype=bf16`` is its bf16 autocast with fp32 weights (the projects'
  ``bf16-mixed``), ``dtype=fp32`` is no autocast.
* **Training**: forward in the same precision with the project's training settings (dropout,
  per-block activation checkpointing from ``workflow.checkpointing``), loss ``mean(z²) + mean(s²)``
  in fp32, backward into the trunk and the inputs (standing in for the embedder the gradient
  would flow on into), an AdamW step; returns the loss.
* **run_blocks** (the probe's shortened depth): the first k blocks of the stack's ``ModuleList``
  run, every block's weights stay allocated (``first_blocks``); inference runs at most k passes.
* **cp=1 only**: ``max_cp = 1`` makes ``cp=auto`` mean 1 and ``check_config`` refuses cp > 1
  before any job starts: these are single-GPU baselines.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, ClassVar, Iterator

import torch
from torch import nn

from cpbench.models import dtypes
from cpbench.models.api import AdapterConfigError
from cpbench.models.pairformer.stage_timer import StageTimer
from cpbench.models.stock.packages import STOCK_PACKAGES, StockPackageError, import_trunk_module, installed_version


@dataclass
class StockBatch:
    """The stock trunk's inputs at N tokens (see the module docstring for the shapes)."""

    s: torch.Tensor          # [1, N, c_s] bf16 (dtype=bf16) or fp32
    z: torch.Tensor          # [1, N, N, c_z] bf16 (dtype=bf16) or fp32
    mask: torch.Tensor       # [1, N] fp32, ones
    pair_mask: torch.Tensor  # [1, N, N] fp32, ones

    @property
    def n_tokens(self) -> int:
        return int(self.mask.shape[-1])


@contextlib.contextmanager
def first_blocks(stack: nn.Module, attr: str, run_blocks: int | None) -> Iterator[None]:
    """Let ``stack`` run only its first ``run_blocks`` blocks (its ``ModuleList`` ``attr``) inside
    the block; all blocks stay allocated and come back afterwards. None or k >= depth: all."""
    blocks = getattr(stack, attr)
    if run_blocks is None or run_blocks >= len(blocks):
        yield
        return
    setattr(stack, attr, nn.ModuleList(list(blocks)[:run_blocks]))
    try:
        yield
    finally:
        setattr(stack, attr, blocks)


# forward(s, z, train) -> (s, z); the step's loss of the trunk's outputs; precision(train) -> context
TrunkForward = Callable[[torch.Tensor, torch.Tensor, bool], tuple[Any, Any]]


def trunk_step(model: nn.Module, s: torch.Tensor, z: torch.Tensor, train: bool, *, forward: TrunkForward,
               loss_of: Callable[[Any, Any], torch.Tensor],
               precision: Callable[[bool], contextlib.AbstractContextManager], blocks_attr: str, recycles: int,
               run_blocks: int | None, timer: StageTimer,
               optimizer: Callable[[], torch.optim.Optimizer]) -> torch.Tensor | None:
    """One step of a trunk that maps ``(s, z)`` to ``(s, z)``, as the stock and peer adapters run it.

    Inference: ``recycles + 1`` passes without autograd, each from a copy of the inputs (so more
    passes cost time, not memory; the probe's depth ``run_blocks=k`` also bounds them), stage
    ``trunk``. Training: forward from the inputs as leaves (their gradients are the embedder's
    share), ``loss_of`` the outputs, backward and one step of ``optimizer()`` (created on first
    use, before any ``run_blocks`` slicing: every block's parameters), stages ``forward`` and
    ``backward_optimizer``. ``run_blocks=k`` runs the first k blocks of ``model.<blocks_attr>``.
    Shapes are the adapter's (per rank); returns the loss (training) or None.
    """
    if not train:
        model.eval()
        with torch.no_grad(), precision(False), first_blocks(model, blocks_attr, run_blocks):
            passes = recycles + 1 if run_blocks is None else min(recycles + 1, run_blocks)
            for _ in range(passes):
                with timer.stage("trunk"):
                    out = forward(s.clone(), z.clone(), False)
                    del out
        return None
    model.train()
    opt = optimizer()
    opt.zero_grad(set_to_none=True)
    s_in = s.detach().requires_grad_(True)
    z_in = z.detach().requires_grad_(True)
    with first_blocks(model, blocks_attr, run_blocks):
        with timer.stage("forward"):
            with precision(True):
                s_out, z_out = forward(s_in, z_in, True)
            loss = loss_of(s_out, z_out)
            del s_out, z_out
        with timer.stage("backward_optimizer"):
            loss.backward()
            opt.step()
    del s_in, z_in  # their gradients (the embedder's share) go with them
    return loss.detach()


def lazy_adamw(owner: Any, model: nn.Module) -> torch.optim.Optimizer:
    """``owner._optimizer``: an AdamW at ``owner.lr`` over all of ``model``'s parameters, made on
    first use (before any ``run_blocks`` slicing) and kept for the following steps."""
    if owner._optimizer is None:
        owner._optimizer = torch.optim.AdamW(model.parameters(), lr=owner.lr)
    return owner._optimizer


@contextlib.contextmanager
def _matmul_precision(level: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(level)`` inside the block, restored afterwards."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(level)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class StockAdapter:
    """Base of the stock adapters; a subclass sets the class attributes and implements
    ``build_trunk``, ``resolve_kernels`` and ``forward``."""

    package: ClassVar[str]                 # key of ``STOCK_PACKAGES``
    blocks_attr: ClassVar[str]             # the stack's ModuleList of blocks
    kernel_choices: ClassVar[tuple[str, ...]] = ("auto", "torch")
    max_cp: ClassVar[int] = 1              # single-GPU baselines (cpbench/models/api.py)

    def __init__(self, sizes: dict[str, int], *, dropout: float, dtype: str, recycles: int, checkpointing: bool,
                 lr: float, kernels: str) -> None:
        if dtype not in dtypes.DTYPES:
            raise ValueError(f"dtype={dtype!r}: allowed {', '.join(dtypes.DTYPES)}")
        if kernels not in self.kernel_choices:
            raise ValueError(f"kernels={kernels!r}: allowed {', '.join(self.kernel_choices)}")
        self.sizes = dict(sizes)
        self.dropout, self.dtype, self.recycles = float(dropout), dtype, int(recycles)
        self.checkpointing, self.lr, self.kernels = bool(checkpointing), float(lr), kernels
        # Imported here, in the worker before its memory cap: the package's modules are not the point's.
        self.module: ModuleType = import_trunk_module(self.package)
        self.kernel: str | None = None     # resolved by build_model
        self._optimizer: torch.optim.Optimizer | None = None
        self._stats: dict[str, Any] = {}

    # ------------------------------------------------------------ what a subclass provides

    def build_trunk(self) -> nn.Module:
        """The stock trunk at ``self.sizes``, built by the package's own constructor."""
        raise NotImplementedError

    def resolve_kernels(self, kernels: str, device: torch.device, train: bool) -> str:
        """The kernel backend that runs for ``model.kernels`` on ``device``."""
        raise NotImplementedError

    def forward(self, trunk: nn.Module, s: torch.Tensor, z: torch.Tensor, batch: StockBatch,
                train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One trunk pass the way the project calls it; ``s``/``z`` shaped as in ``StockBatch``."""
        raise NotImplementedError

    @classmethod
    def check_kernels(cls, kernels: str, device: str) -> None:
        """Refuse a kernel backend the device or the installed packages cannot run."""

    # ------------------------------------------------------------ the protocol

    @classmethod
    def check_config(cls, model: dict, cp: int, device: str, train: bool) -> None:
        """cp=1 only, a known kernel choice, an importable package (``cpbench/models/api.py``)."""
        package = STOCK_PACKAGES[cls.package]
        if cp > cls.max_cp:
            raise AdapterConfigError("cp", cp, f"model=stock/{package.model} is the stock {package.title} trunk, "
                                     "a single-GPU baseline: cp=1 only (its max N goes beside the CP configs' in the report)")
        kernels = model.get("kernels", "auto")
        if kernels not in cls.kernel_choices:
            raise AdapterConfigError("model.kernels", kernels, f"one of {', '.join(cls.kernel_choices)} "
                                     f"for model=stock/{package.model}")
        try:
            import_trunk_module(cls.package)
        except StockPackageError as exc:
            raise AdapterConfigError("model", f"stock/{package.model}", str(exc)) from None
        cls.check_kernels(kernels, device)

    def build_model(self, mesh: Any, device: torch.device) -> nn.Module:
        """The stock trunk with random weights in fp32 on ``device`` (built there directly)."""
        device = torch.device(device)
        self.dtype = dtypes.resolve(self.dtype, device.type)[0]  # "auto" resolves on the device
        with device:
            return self.build_trunk()

    def build_batch(self, N: int, n_atoms: int, S: int, mesh: Any, device: torch.device) -> StockBatch:
        """``StockBatch`` at N tokens; atoms and MSA do not enter the stock trunk module."""
        device = torch.device(device)
        generator = torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,))))
        c_s, c_z = self.sizes["c_s"], self.sizes["c_z"]
        dtype = torch.bfloat16 if self.dtype == "bf16" else torch.float32  # what the embedder's Linear gives
        return StockBatch(
            s=torch.randn(1, N, c_s, generator=generator, device=device, dtype=dtype),
            z=torch.randn(1, N, N, c_z, generator=generator, device=device, dtype=dtype),
            mask=torch.ones(1, N, device=device),
            pair_mask=torch.ones(1, N, N, device=device),
        )

    def run_step(self, model: nn.Module, batch: StockBatch, train: bool,
                 run_blocks: int | None = None) -> torch.Tensor | None:
        """One inference step (``recycles + 1`` passes) or one training step (see the module
        docstring); ``run_blocks=k`` runs the first k blocks of every pass."""
        device = batch.z.device
        if self.kernel is None:
            self.kernel = self.resolve_kernels(self.kernels, device, train)
        timer = StageTimer(device)
        loss = trunk_step(
            model, batch.s, batch.z, train,
            forward=lambda s, z, training: self.forward(model, s, z, batch, train=training),
            loss_of=lambda s, z: z.float().square().mean() + s.float().square().mean(),
            precision=lambda training: self._precision(device, train=training), blocks_attr=self.blocks_attr,
            recycles=self.recycles, run_blocks=run_blocks, timer=timer, optimizer=lambda: lazy_adamw(self, model))
        self._record(timer)
        return loss

    def stats(self) -> dict[str, Any]:
        """The last step's ``stage_ms`` (inference: trunk, summed over the passes; training:
        forward, backward_optimizer), on CUDA ``stage_peak_gib``, the ``kernels`` that ran and
        the ``package`` (distribution and installed version)."""
        return dict(self._stats)

    # ------------------------------------------------------------ helpers

    def _precision(self, device: torch.device, train: bool = False) -> contextlib.AbstractContextManager:
        """bf16: the projects' mixed precision (autocast, fp32 weights); fp32: none; both with the
        project's float32 matmul precision (``float32_matmul_precision``) for the step."""
        stack = contextlib.ExitStack()
        stack.enter_context(_matmul_precision(self.float32_matmul_precision(train)))
        if self.dtype == "bf16":
            stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
        return stack

    def float32_matmul_precision(self, train: bool) -> str:
        """``torch.set_float32_matmul_precision`` while the project runs its trunk ("highest":
        exact fp32 matmuls, torch's default; OpenFold3 predicts with TF32, "high")."""
        return "highest"

    def _record(self, timer: StageTimer) -> None:
        package = STOCK_PACKAGES[self.package]
        self._stats = {"stage_ms": timer.ms(), "kernels": self.kernel,
                       "package": f"{package.distribution} {installed_version(package) or '?'}"}
        peaks = timer.peaks_gib()
        if peaks:
            self._stats["stage_peak_gib"] = peaks
