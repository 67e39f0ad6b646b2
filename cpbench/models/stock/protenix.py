"""``model=stock/protenix``: the stock Protenix trunk, ``protenix.model.modules.pairformer.PairformerStack``.

Built as ``configs/configs_base.py`` builds ``model.pairformer`` (protenix 2.0.0): c_s 384, c_z 128,
48 blocks, 16 single-attention heads, dropout 0.25 (triangle multiplication hidden 128 and triangle
attention 4 heads x 32 are fixed in Protenix's block), single and pair transitions x4. Called as
``Protenix.get_pairformer_output`` calls it (no batch dimension, ``pair_mask=None``), with the
settings of ``runner/inference.py``:

* precision: ``dtype`` bf16 is its default (bf16 autocast on CUDA, fp32 weights); fp32 runs it
  without autocast.
* chunking: ``infer_setting.chunk_size_thresholds`` with ``dynamic_chunk_size`` (``CHUNK_BY_TOKENS``:
  none up to 1,024 tokens, then 512, 256, 128, and 32 above 2,560), ``inplace_safe`` without
  autograd (in-place updates).
* kernels (``model.kernels``): ``cueq`` (``triangle_multiplicative`` and ``triangle_attention`` =
  ``cuequivariance``: its default), ``triattention`` (its Triton triangle attention), ``deepspeed``
  (DeepSpeed's evoformer attention), ``torch``; ``auto`` is ``cueq`` where one block runs with it,
  else ``torch`` (what it falls back to on GPUs it does not support).
* its fused CUDA layer norm: Protenix JIT-compiles it while importing unless ``LAYERNORM_TYPE`` says
  otherwise (that needs nvcc and CUDA_HOME); ``packages.py`` sets ``LAYERNORM_TYPE=torch``, as its
  own CPU tests do, unless the environment sets it (``LAYERNORM_TYPE=fast_layernorm`` for the fused one).
* training: dropout 0.25, ``blocks_per_ckpt`` 1 with ``workflow.checkpointing`` (its default), no
  chunking, no in-place updates.
"""

from __future__ import annotations

import torch
from torch import nn

from cpbench.models.api import AdapterConfigError
from cpbench.models.stock.adapter import StockAdapter, StockBatch

# infer_setting.chunk_size_thresholds of configs/configs_base.py: (up to N tokens, chunk size);
# Protenix._get_dynamic_chunk_size uses 32 above the last one.
CHUNK_BY_TOKENS = ((1024, None), (1536, 512), (2048, 256), (2560, 128))
CHUNK_ABOVE = 32
# model.kernels -> (triangle_multiplicative, triangle_attention) as Protenix names them
KERNELS = {"torch": ("torch", "torch"), "cueq": ("cuequivariance", "cuequivariance"),
           "triattention": ("torch", "triattention"), "deepspeed": ("torch", "deepspeed")}


def inference_chunk_size(n_tokens: int) -> int | None:
    """Protenix's dynamic inference chunk size at ``n_tokens`` (``CHUNK_BY_TOKENS``)."""
    for up_to, chunk in CHUNK_BY_TOKENS:
        if n_tokens <= up_to:
            return chunk
    return CHUNK_ABOVE


class ProtenixAdapter(StockAdapter):
    """Hydra target of ``model=stock/protenix`` (``cpbench/conf/model/stock/protenix.yaml``)."""

    package = "protenix"
    blocks_attr = "blocks"
    kernel_choices = ("auto", *KERNELS)

    def __init__(self, c_s: int = 384, c_z: int = 128, blocks: int = 48, heads_single: int = 16,
                 transition_factor: int = 4, dropout: float = 0.25, dtype: str = "bf16", recycles: int = 0,
                 checkpointing: bool = False, lr: float = 1e-4, kernels: str = "auto") -> None:
        super().__init__(dict(c_s=c_s, c_z=c_z, blocks=blocks, heads_single=heads_single,
                              transition_factor=transition_factor),
                         dropout=dropout, dtype=dtype, recycles=recycles, checkpointing=checkpointing, lr=lr,
                         kernels=kernels)

    def build_trunk(self) -> nn.Module:
        sz = self.sizes
        return self.module.PairformerStack(
            n_blocks=sz["blocks"], n_heads=sz["heads_single"], c_z=sz["c_z"], c_s=sz["c_s"],
            num_intermediate_factor=sz["transition_factor"], dropout=self.dropout,
            blocks_per_ckpt=1 if self.checkpointing else None, hidden_scale_up=False)

    @classmethod
    def check_kernels(cls, kernels: str, device: str) -> None:
        if kernels not in ("auto", "torch") and device != "cuda":
            raise AdapterConfigError("model.kernels", kernels, "needs a CUDA device; on a CPU: auto or torch")

    def resolve_kernels(self, kernels: str, device: torch.device, train: bool) -> str:
        if kernels != "auto":
            return kernels
        return "cueq" if device.type == "cuda" and self.kernel_works("cueq", device) else "torch"

    def kernel_works(self, name: str, device: torch.device) -> bool:
        """Whether one small Protenix block (pair track only) runs with kernel ``name`` here."""
        with device:
            block = self.module.PairformerBlock(n_heads=2, c_z=16, c_s=0).eval()
        multiplicative, attention = KERNELS[name]
        try:
            with torch.no_grad(), self._precision(device):
                block(None, torch.randn(8, 8, 16, device=device), pair_mask=None,
                      triangle_multiplicative=multiplicative, triangle_attention=attention)
        except Exception:  # noqa: BLE001 - any failure of the optional kernel means: run without it
            return False
        return True

    def forward(self, trunk: nn.Module, s: torch.Tensor, z: torch.Tensor, batch: StockBatch,
                train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        multiplicative, attention = KERNELS[self.kernel]
        return trunk(s[0], z[0], pair_mask=None, triangle_multiplicative=multiplicative, triangle_attention=attention,
                     inplace_safe=not train, chunk_size=None if train else inference_chunk_size(batch.n_tokens))
