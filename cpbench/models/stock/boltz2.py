"""``model=stock/boltz2``: the stock Boltz-2 trunk, ``boltz.model.layers.pairformer.PairformerModule``.

Built as ``boltz predict`` builds it for Boltz-2 (``PairformerArgsV2`` in ``boltz/main.py``):
c_s 384, c_z 128, 64 blocks, 16 single-attention heads, triangle attention 4 heads x 32, the v2
single attention, transitions x4 (fixed in Boltz). Called as ``Boltz2.forward`` calls it, with
the precision and chunking of ``boltz predict``:

* precision: ``bf16-mixed`` (bf16 autocast, fp32 weights; Boltz runs the single track in fp32
  inside each block by itself); ``dtype=fp32`` runs it without autocast, as Boltz-1 predicts.
* chunking: the module's own -- triangle attention in chunks of 128 query rows above
  ``boltz.data.const.chunk_size_threshold`` (384) tokens, else 512; nothing else is chunked.
* kernels (``model.kernels``): ``cueq`` is Boltz's ``use_kernels`` (cuEquivariance triangle
  multiplication and triangle attention; ``boltz predict`` turns it on on GPUs of compute
  capability >= 8 and needs the ``cuda`` extra: ``cuequivariance_torch``); ``torch`` is
  ``--no_kernels``; ``auto`` is ``cueq`` where a one-op smoke call of the kernel succeeds on this
  GPU, else ``torch``.
* training: dropout 0.25 (the module's default, active in training only), per-block activation
  checkpointing with ``workflow.checkpointing`` (Boltz's ``activation_checkpointing``).

Example::

    adapter = Boltz2Adapter(c_s=32, c_z=16, blocks=2, heads_single=4, heads_tri=2, head_dim_tri=8, dtype="fp32")
    trunk = adapter.build_model(None, torch.device("cpu"))
    batch = adapter.build_batch(64, 512, 1, None, torch.device("cpu"))
    adapter.run_step(trunk, batch, train=False, run_blocks=1)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import types
from collections.abc import Iterator
from typing import ClassVar

import torch
from torch import nn

from cpbench.models.api import AdapterConfigError
from cpbench.models.stock.adapter import StockAdapter, StockBatch

CUEQ_MODULE = "cuequivariance_torch"


@contextlib.contextmanager
def torch_truncnorm(initialize: types.ModuleType) -> Iterator[None]:
    """Inside the context Boltz's ``initialize.trunc_normal_init_`` (its LeCun and He inits) draws
    the same distribution with torch on the weights' device: a normal truncated at two of its
    standard deviations, scaled to variance ``scale / fan``. Boltz draws it with scipy on the host
    in float64, one weight at a time: about 12 s for the 64 blocks on 2 CPU cores, most of the
    ~30 s each probe point spent before its step on the H200 machine (docs/stock_models.md). The
    weights are random either way; only how fast they are drawn changes."""
    original = initialize.trunc_normal_init_
    unit_std = float(initialize.truncnorm.std(a=-2, b=2, loc=0, scale=1))  # of the standard normal cut at +-2

    def trunc_normal_init_(weights: torch.Tensor, scale: float = 1.0, fan: str = "fan_in") -> None:
        std = math.sqrt(scale / max(1, initialize._calculate_fan(weights.shape, fan))) / unit_std
        with torch.no_grad():
            torch.nn.init.trunc_normal_(weights, mean=0.0, std=std, a=-2 * std, b=2 * std)

    initialize.trunc_normal_init_ = trunc_normal_init_
    try:
        yield
    finally:
        initialize.trunc_normal_init_ = original


class Boltz2Adapter(StockAdapter):
    """Hydra target of ``model=stock/boltz2`` (``cpbench/conf/model/stock/boltz2.yaml``)."""

    package = "boltz2"
    blocks_attr = "layers"
    # probe.depth=auto: two blocks. The first block adds Boltz's bf16 updates to the embedder's bf16
    # z with an fp32 dropout mask, so z leaves it in fp32: on one H200 at N=1,536 one block peaked
    # 10.90 GiB, two 12.03 and all 64 12.09 (docs/benchmarks/2026-12-01-h200-d/call-b,
    # docs/benchmarks/2026-12-01-h200-d/call-c).
    probe_depth: ClassVar[int] = 2
    kernel_choices = ("auto", "torch", "cueq")

    def __init__(self, c_s: int = 384, c_z: int = 128, blocks: int = 64, heads_single: int = 16, heads_tri: int = 4,
                 head_dim_tri: int = 32, dropout: float = 0.25, dtype: str = "bf16", recycles: int = 0,
                 checkpointing: bool = False, lr: float = 1e-4, kernels: str = "auto") -> None:
        super().__init__(dict(c_s=c_s, c_z=c_z, blocks=blocks, heads_single=heads_single, heads_tri=heads_tri,
                              head_dim_tri=head_dim_tri),
                         dropout=dropout, dtype=dtype, recycles=recycles, checkpointing=checkpointing, lr=lr,
                         kernels=kernels)

    def build_trunk(self) -> nn.Module:
        sz = self.sizes
        with torch_truncnorm(importlib.import_module("boltz.model.layers.initialize")):
            return self.module.PairformerModule(
                token_s=sz["c_s"], token_z=sz["c_z"], num_blocks=sz["blocks"], num_heads=sz["heads_single"],
                dropout=self.dropout, pairwise_head_width=sz["head_dim_tri"], pairwise_num_heads=sz["heads_tri"],
                post_layer_norm=False, activation_checkpointing=self.checkpointing, v2=True)

    @classmethod
    def check_kernels(cls, kernels: str, device: str) -> None:
        if kernels == "cueq" and (device != "cuda" or importlib.util.find_spec(CUEQ_MODULE) is None):
            raise AdapterConfigError("model.kernels", kernels, f"needs a CUDA device and {CUEQ_MODULE} "
                                     "(pip install cuequivariance_torch cuequivariance_ops_torch_cu12; boltz's `cuda` "
                                     "extra); or model.kernels=torch")

    def resolve_kernels(self, kernels: str, device: torch.device, train: bool) -> str:
        if kernels != "auto":
            return kernels
        return "cueq" if device.type == "cuda" and self.cueq_works(device) else "torch"

    def cueq_works(self, device: torch.device) -> bool:
        """Whether Boltz's kernel path runs here: cuEquivariance importable, compute capability
        >= 8 (Boltz's own condition), and Boltz's triangle attention and multiplication with
        ``use_kernels`` succeed on an 8-token pair tensor (an import alone has been seen to
        succeed where the first call fails: ``../shared/gpu/README.md``)."""
        if importlib.util.find_spec(CUEQ_MODULE) is None or torch.cuda.get_device_capability(device)[0] < 8:
            return False
        with device:
            attention = self.module.TriangleAttentionStartingNode(16, 8, 2, inf=1e9)
            multiplication = self.module.TriangleMultiplicationOutgoing(16)
        z, mask = torch.randn(1, 8, 8, 16, device=device), torch.ones(1, 8, 8, device=device)
        try:
            with torch.no_grad(), self._precision(device):
                attention(z, mask=mask, use_kernels=True)
                multiplication(z, mask=mask, use_kernels=True)
        except Exception:  # noqa: BLE001 - any failure of the optional kernel means: run without it
            return False
        return True

    def forward(self, trunk: nn.Module, s: torch.Tensor, z: torch.Tensor, batch: StockBatch,
                train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return trunk(s, z, mask=batch.mask, pair_mask=batch.pair_mask, use_kernels=self.kernel == "cueq")

