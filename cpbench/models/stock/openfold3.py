"""``model=stock/openfold3``: the stock OpenFold3 trunk, ``openfold3.core.model.latent.pairformer.PairFormerStack``.

Built as ``openfold3/projects/of3_all_atom/config/model_config.py`` builds ``architecture.pairformer``
(openfold3 0.5.0): c_s 384, c_z 128, 48 blocks, 16 single-attention heads of 24 channels, triangle
multiplication hidden 128, triangle attention 4 heads x 32, SwiGLU transitions x4, pair dropout
0.25, non-reentrant checkpointing. Called as ``OpenFold3.run_trunk`` calls it, with the settings of
``run_openfold.py predict``:

* precision: ``pl_trainer_args.precision`` defaults to ``32-true`` and ``predict`` enables TF32
  matmuls (``--use_tf32 True``): that is ``dtype=fp32`` here; ``dtype=bf16`` is its
  ``bf16-mixed`` option (bf16 autocast, fp32 weights).
* chunking (``model_setting_presets.yml``, ``predict``): ``chunk_size`` 1024 with
  ``tune_chunk_size`` on -- OpenFold3's ``ChunkSizeTuner`` tries the first block at powers of two
  up to 1024 and keeps the largest that runs (its trial runs count in the peak, as they do for
  its users) -- and ``inplace_safe`` (in-place updates without autograd).
* kernels (``model.kernels``): ``triton`` (its Triton triangle-attention kernel,
  ``use_triton_triangle_kernels``: the ``eval`` default), ``cueq`` (``use_cueq_triangle_kernels``),
  ``deepspeed`` (``use_deepspeed_evo_attention``), ``torch`` (none); ``auto`` is ``triton`` for
  inference on a GPU where OpenFold3 found Triton, else ``torch`` (training: the ``train`` memory
  settings turn every kernel off).
* training: pair dropout 0.25, ``blocks_per_ckpt`` 1 with ``workflow.checkpointing`` (the ``train``
  preset), no chunking, no in-place updates.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from cpbench.models.api import AdapterConfigError
from cpbench.models.stock.adapter import StockAdapter, StockBatch

PREDICT_CHUNK_SIZE = 1024  # model_setting_presets.yml: predict.settings.memory.eval.chunk_size
KERNEL_FLAGS = {"triton": "use_triton_triangle_kernels", "cueq": "use_cueq_triangle_kernels",
                "deepspeed": "use_deepspeed_evo_attention"}
# How openfold3.core.model.primitives.attention records which optional kernels it found.
KERNEL_FOUND = {"triton": "TRITON_AVAILABLE", "cueq": "cueq_is_installed", "deepspeed": "ds4s_is_installed"}
ATTENTION_MODULE = "openfold3.core.model.primitives.attention"


class OpenFold3Adapter(StockAdapter):
    """Hydra target of ``model=stock/openfold3`` (``cpbench/conf/model/stock/openfold3.yaml``)."""

    package = "openfold3"
    blocks_attr = "blocks"
    kernel_choices = ("auto", "torch", "triton", "cueq", "deepspeed")

    def __init__(self, c_s: int = 384, c_z: int = 128, blocks: int = 48, heads_single: int = 16, heads_tri: int = 4,
                 head_dim_tri: int = 32, c_hidden_mul: int = 128, transition_factor: int = 4, dropout: float = 0.25,
                 dtype: str = "fp32", recycles: int = 0, checkpointing: bool = False, lr: float = 1e-4,
                 kernels: str = "auto") -> None:
        if c_s % heads_single:
            raise ValueError(f"c_s={c_s} must be a multiple of heads_single={heads_single}")
        super().__init__(dict(c_s=c_s, c_z=c_z, blocks=blocks, heads_single=heads_single, heads_tri=heads_tri,
                              head_dim_tri=head_dim_tri, c_hidden_mul=c_hidden_mul, transition_factor=transition_factor),
                         dropout=dropout, dtype=dtype, recycles=recycles, checkpointing=checkpointing, lr=lr,
                         kernels=kernels)

    def build_trunk(self) -> nn.Module:
        sz = self.sizes
        return self.module.PairFormerStack(
            c_s=sz["c_s"], c_z=sz["c_z"], c_hidden_pair_bias=sz["c_s"] // sz["heads_single"],
            no_heads_pair_bias=sz["heads_single"], c_hidden_mul=sz["c_hidden_mul"], c_hidden_pair_att=sz["head_dim_tri"],
            no_heads_pair=sz["heads_tri"], no_blocks=sz["blocks"], transition_type="swiglu",
            transition_n=sz["transition_factor"], pair_dropout=self.dropout, fuse_projection_weights=False,
            blocks_per_ckpt=1 if self.checkpointing else None, inf=1e9, use_reentrant=False,
            clear_cache_between_blocks=False, tune_chunk_size=True)

    @classmethod
    def check_kernels(cls, kernels: str, device: str) -> None:
        if kernels in KERNEL_FLAGS and (device != "cuda" or not kernel_found(kernels)):
            raise AdapterConfigError("model.kernels", kernels, f"needs a CUDA device and OpenFold3's {kernels} kernel "
                                     f"({ATTENTION_MODULE}.{KERNEL_FOUND[kernels]} is False here); or model.kernels=torch")

    def resolve_kernels(self, kernels: str, device: torch.device, train: bool) -> str:
        if kernels != "auto":
            return kernels
        return "triton" if device.type == "cuda" and not train and kernel_found("triton") else "torch"

    def float32_matmul_precision(self, train: bool) -> str:
        return "highest" if train else "high"  # predict --use_tf32 True; train --use_tf32 False

    def forward(self, trunk: nn.Module, s: torch.Tensor, z: torch.Tensor, batch: StockBatch,
                train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        flags = {flag: self.kernel == name for name, flag in KERNEL_FLAGS.items()}
        return trunk(s, z, single_mask=batch.mask, pair_mask=batch.pair_mask,
                     chunk_size=None if train else PREDICT_CHUNK_SIZE, use_lma=False, inplace_safe=not train,
                     **flags)


def kernel_found(name: str) -> bool:
    """Whether OpenFold3 found its optional ``name`` kernel when it imported (``KERNEL_FOUND``)."""
    return bool(getattr(importlib.import_module(ATTENTION_MODULE), KERNEL_FOUND[name], False))
