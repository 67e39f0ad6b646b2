"""``model=foldcp/boltz2``: Fold-CP's context-parallel Boltz-2 Pairformer trunk behind cpbench's hooks.

Built as Fold-CP builds it (``boltz.distributed.predict``): the serial Boltz-2 ``PairformerModule``
of Fold-CP's package at Boltz-2 sizes (c_s 384, c_z 128, 64 blocks, 16 single-attention heads,
triangle attention 4 x 32, v2, dropout 0.25), wrapped by its DTensor ``PairformerModule`` on the
manager's ``dp x cp_axis_0 x cp_axis_1`` mesh (``manager.py``), kernels chosen with its
``SetTriAttnBackend`` / ``SetAttnPairBiasBackend``. Per rank of a ``g x g`` grid (``n = N_pad / g``):
``s: [1, n, c_s]``, ``z: [1, n, n, c_z]`` (``inputs.py``); the trunk's own ring collectives (Cannon
triangle multiplication, rotating triangle attention and pair-bias attention).

* **topology**: ``2d`` with cp a perfect square: 1 (a 1x1 grid, the same DTensor trunk), 4, 9, 16, ...
  The installed Fold-CP has no 1D trunk (``package.TRUNK_1D_MODULE``): ``topology=1d`` runs cp=1 only.
* **Inference**: ``recycles + 1`` passes without autograd, each from a fresh copy of the inputs, in
  the model's precision (``dtype=bf16``: bf16 autocast over fp32 weights, Fold-CP's ``bf16-mixed``;
  ``fp32``: none). Its own kernels and chunking: the ring itself bounds what a rank holds.
* **Training**: forward in the same precision with dropout, per-block activation checkpointing
  (``workflow.checkpointing``: Fold-CP's ``activation_checkpointing``; ``model.cpu_offloading``
  moves the checkpoints to host memory), loss ``mean(z^2) + mean(s^2)`` over the real tokens in
  fp32 (one global value, reduced by DTensor), backward into the trunk and the inputs, an AdamW step.
* **Weights**: ``weight_init=boltz`` is the module as constructed (Boltz's initialisation: its
  output projections start at zero, so a fresh trunk returns its inputs; time and memory do not
  depend on it); ``uniform`` draws every parameter from U(-0.1, 0.1), as Fold-CP's parity tests
  do, so that every output depends on every weight. The same on every rank (the harness seeds
  torch identically), hence the same global model at any cp.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Any, ClassVar

import torch
from torch import nn

from cpbench.models import dtypes
from cpbench.models.api import AdapterConfigError
from cpbench.models.foldcp import package
from cpbench.models.foldcp.inputs import FoldCPBatch, build_foldcp_batch
from cpbench.models.foldcp.manager import foldcp_manager
from cpbench.models.pairformer.stage_timer import StageTimer
from cpbench.models.stock.adapter import lazy_adamw, trunk_step
from cpbench.models.stock.boltz2 import torch_truncnorm

WEIGHT_INITS = ("boltz", "uniform")
UNIFORM_INIT_BOUND = 0.1


def _is_square(cp: int) -> bool:
    return math.isqrt(cp) ** 2 == cp


class FoldCPBoltz2Adapter:
    """Hydra target of ``model=foldcp/boltz2`` (``cpbench/conf/model/foldcp/boltz2.yaml``).

    ``topology`` and ``topology_cp0`` mirror the run's topology keys for ``check_config`` (which
    sees the model config, not the mesh); at build time the mesh itself decides (``manager.py``)."""

    # probe.depth=auto: two blocks, as for the stock Boltz-2 trunk (the first block turns a bf16
    # input pair into fp32); the probe still checks the claim against the full step.
    probe_depth: ClassVar[int] = 2

    def __init__(self, c_s: int = 384, c_z: int = 128, blocks: int = 64, heads_single: int = 16, heads_tri: int = 4,
                 head_dim_tri: int = 32, dropout: float = 0.25, dtype: str = "bf16", recycles: int = 0,
                 checkpointing: bool = False, cpu_offloading: bool = False, lr: float = 1e-4,
                 tri_attn_backend: str = "auto", pair_bias_backend: str = "auto", weight_init: str = "boltz",
                 topology: str = "2d", topology_cp0: int | None = None) -> None:
        if dtype not in dtypes.DTYPES:
            raise ValueError(f"dtype={dtype!r}: allowed {', '.join(dtypes.DTYPES)}")
        self.sizes = dict(c_s=c_s, c_z=c_z, blocks=blocks, heads_single=heads_single, heads_tri=heads_tri,
                          head_dim_tri=head_dim_tri)
        self.dropout, self.dtype, self.recycles = float(dropout), dtype, int(recycles)
        self.checkpointing, self.cpu_offloading, self.lr = bool(checkpointing), bool(cpu_offloading), float(lr)
        self.tri_attn_backend, self.pair_bias_backend, self.weight_init = tri_attn_backend, pair_bias_backend, weight_init
        # Imported here, in the worker before its memory cap: the package's modules are not the point's.
        self.trunk_module = package.import_trunk()
        self.kernels: dict[str, str] = {}
        self._manager: Any = None          # Fold-CP's DistributedManager, set by build_model
        self._optimizer: torch.optim.Optimizer | None = None
        self._stats: dict[str, Any] = {}

    # ------------------------------------------------------------ checks before any job starts

    @classmethod
    def check_config(cls, model: dict, cp: int, device: str, train: bool) -> None:
        """An importable Fold-CP, a square grid, a 2D topology beyond cp=1, runnable backends."""
        try:
            package.import_trunk()
        except package.FoldCPPackageError as exc:
            raise AdapterConfigError("model", "foldcp/boltz2", str(exc)) from None
        topology = model.get("topology", "2d")
        if topology != "2d" and cp > 1:
            has_1d = package.module_present(package.TRUNK_1D_MODULE)
            raise AdapterConfigError("topology", topology, "2d for model=foldcp/boltz2 at cp > 1 (the installed Fold-CP "
                                     + ("has a 1D trunk, which this adapter does not run yet)" if has_1d
                                        else f"has no 1D trunk: {package.TRUNK_1D_MODULE})"))
        if not _is_square(cp):
            raise AdapterConfigError("cp", cp, "a perfect square (1, 4, 9, 16, ...) for model=foldcp/boltz2: "
                                     "Fold-CP's 2D grid is square")
        cp0 = model.get("topology_cp0")
        if cp0 is not None and int(cp0) != math.isqrt(cp):
            raise AdapterConfigError("topology.cp0", cp0, f"null or {math.isqrt(cp)} for model=foldcp/boltz2 "
                                     f"(a square {math.isqrt(cp)}x{math.isqrt(cp)} grid at cp={cp})")
        refusal = package.tri_attn_refusal(str(model.get("tri_attn_backend", "auto")), device)
        if refusal:
            raise AdapterConfigError("model.tri_attn_backend", model.get("tri_attn_backend"), refusal)
        pair_bias = str(model.get("pair_bias_backend", "auto"))
        if pair_bias not in package.PAIR_BIAS_BACKENDS:
            raise AdapterConfigError("model.pair_bias_backend", pair_bias, f"one of {', '.join(package.PAIR_BIAS_BACKENDS)}")
        if pair_bias == "torch_flex_attn" and device != "cuda":
            raise AdapterConfigError("model.pair_bias_backend", pair_bias, "needs a CUDA device (Fold-CP's flex attention "
                                     "path takes CUDA tensors); on a CPU: reference or auto")
        if model.get("weight_init", "boltz") not in WEIGHT_INITS:
            raise AdapterConfigError("model.weight_init", model.get("weight_init"), f"one of {', '.join(WEIGHT_INITS)}")

    # ------------------------------------------------------------ the protocol

    def build_model(self, mesh: Any, device: torch.device) -> nn.Module:
        """Fold-CP's DTensor trunk on this rank: the serial module built on ``device`` with the
        same weights on every rank, then distributed by Fold-CP's wrapper (parameters replicated)."""
        from boltz.distributed.model.modules.utils import (
            SDPAWithBiasBackend,
            SetAttnPairBiasBackend,
            SetTriAttnBackend,
            TriAttnBackend,
        )
        from boltz.model.layers.pairformer import PairformerModule as SerialPairformerModule

        device = torch.device(device)
        self.dtype = dtypes.resolve(self.dtype, device.type)[0]  # "auto" resolves on the device
        manager = foldcp_manager(mesh, device)
        sz = self.sizes
        with device, torch_truncnorm(importlib.import_module("boltz.model.layers.initialize")):
            serial = SerialPairformerModule(
                token_s=sz["c_s"], token_z=sz["c_z"], num_blocks=sz["blocks"], num_heads=sz["heads_single"],
                dropout=self.dropout, pairwise_head_width=sz["head_dim_tri"], pairwise_num_heads=sz["heads_tri"],
                post_layer_norm=False, activation_checkpointing=self.checkpointing, v2=True)
        if self.weight_init == "uniform":
            with torch.no_grad():
                for param in serial.parameters():
                    param.uniform_(-UNIFORM_INIT_BOUND, UNIFORM_INIT_BOUND)
        trunk = self.trunk_module.PairformerModule(serial, manager, cpu_offloading=self.cpu_offloading)
        del serial
        self.kernels = {"tri_attn": package.resolve_tri_attn(self.tri_attn_backend, device.type),
                        "pair_bias": package.resolve_pair_bias(self.pair_bias_backend, device.type)}
        trunk.apply(SetTriAttnBackend(TriAttnBackend(self.kernels["tri_attn"])))
        trunk.apply(SetAttnPairBiasBackend(SDPAWithBiasBackend(self.kernels["pair_bias"])))
        self._manager = manager
        return trunk

    def build_batch(self, N: int, n_atoms: int, S: int, mesh: Any, device: torch.device) -> FoldCPBatch:
        """The trunk's inputs at N tokens (``inputs.py``); atoms and MSA do not enter the trunk."""
        device = torch.device(device)
        seed = int(torch.randint(0, 2**62, (1,)))  # the same on every rank: the harness seeds torch alike
        dtype = torch.bfloat16 if dtypes.resolve(self.dtype, device.type)[0] == "bf16" else torch.float32
        return build_foldcp_batch(foldcp_manager(mesh, device), N, self.sizes["c_s"], self.sizes["c_z"], seed, dtype, device)

    def run_step(self, model: nn.Module, batch: FoldCPBatch, train: bool,
                 run_blocks: int | None = None) -> torch.Tensor | None:
        """One inference step (``recycles + 1`` passes) or one training step (module docstring);
        ``run_blocks=k`` runs the first k blocks of every pass (every block's weights allocated)."""
        device = batch.z.device
        timer = StageTimer(device)
        loss = trunk_step(
            model, batch.s, batch.z, train,
            forward=lambda s, z, training: model(s=s, z=z, mask=batch.mask, pair_mask=batch.pair_mask),
            loss_of=lambda s, z: trunk_loss(s, z, batch), precision=lambda training: self._precision(device),
            blocks_attr="layers", recycles=self.recycles, run_blocks=run_blocks, timer=timer,
            optimizer=lambda: lazy_adamw(self, model))
        self._record(timer)
        return loss

    def stats(self) -> dict[str, Any]:
        """The last step's ``stage_ms`` (inference: trunk, summed over the passes; training:
        forward, backward_optimizer), on CUDA ``stage_peak_gib``, the ``kernels`` that ran (one
        label, ``package.kernels_label``; ``kernel_backends`` by kind), the ``package`` (version and
        Fold-CP commit) and the ``grid`` (``dp x cp_axis_0 x cp_axis_1``)."""
        return dict(self._stats)

    # ------------------------------------------------------------ helpers

    def _precision(self, device: torch.device) -> contextlib.AbstractContextManager:
        """bf16: Fold-CP's bf16-mixed (autocast over fp32 weights); fp32: none."""
        if self.dtype == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _record(self, timer: StageTimer) -> None:
        mesh = self._manager.device_mesh_subgroups
        self._stats = {"stage_ms": timer.ms(), "kernels": package.kernels_label(self.kernels),
                       "kernel_backends": dict(self.kernels), "package": package.version_label(),
                       "grid": "x".join(str(n) for n in mesh.shape)}
        peaks = timer.peaks_gib()
        if peaks:
            self._stats["stage_peak_gib"] = peaks


def trunk_loss(s: Any, z: Any, batch: FoldCPBatch) -> torch.Tensor:
    """``mean(z^2) + mean(s^2)`` over the real tokens (and token pairs) in fp32: a plain scalar,
    the same on every rank (DTensor reduces the sharded sums; its backward shards the gradient).

    Args:
        s: ``[1, N_pad, c_s]`` DTensor (local ``[1, n, c_s]``); z: ``[1, N_pad, N_pad, c_z]`` (local ``[1, n, n, c_z]``).
    """
    n = batch.n_tokens
    z_sum = (z.float().square() * batch.pair_mask.unsqueeze(-1)).sum()
    s_sum = (s.float().square() * batch.mask.unsqueeze(-1)).sum()
    loss = z_sum / (n * n * z.shape[-1]) + s_sum / (n * s.shape[-1])
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss
