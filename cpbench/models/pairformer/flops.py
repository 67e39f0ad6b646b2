"""Analytic FLOPs of the reference Pairformer trunk (the report turns them into TFLOP/s and MFU).

Counts follow the AF3 / Boltz-2 Pairformer block (AF3 Algorithms 11-15, 24) at the sizes of
``cpbench/conf/model/pairformer.yaml``. Conventions, stated once here and in the report:

* Only matrix products are counted (linear layers, the triangular products, attention scores
  and attention-weighted values), at 2 FLOPs per multiply-add, the convention of MFU figures
  (nanoGPT, PaLM). LayerNorm, gating, softmax and other element-wise work is left out: it is
  bandwidth-bound and well under 1 % of the matmul FLOPs at N >= 256.
* ``N`` is the real token count, not the padded one: padding is overhead, not useful work.
* Only the Pairformer blocks are counted, not the input embedder, the MSA module, the atom
  encoder or a diffusion sampler: MFU is the Pairformer's, and the other stages are reported
  as their own stage times where the adapter measures them.
* A step runs ``recycles + 1`` trunk passes (Boltz convention: the recycling passes plus the
  final one). Training: the ``recycles`` no-grad passes cost 1x forward each; the gradient pass
  costs 3x forward (forward + backward at 2x: the model FLOPs, the MFU convention of PaLM and
  nanoGPT). Activation checkpointing recomputes on top of that, which MFU does not count: the
  reference trunk checkpoints nested (``trunk.py``, ``block.py``), each block recomputed in
  backward and each op inside that recompute recomputed once more, so
  ``RECOMPUTE_PASSES = 2`` and the hardware executes 5x forward per checkpointed gradient pass
  (``step_flops(...)["hardware"]``; ``tests/*/test_flops.py`` checks the recompute against torch's
  FLOP counter). Attention backward is counted at 2x its forward, as for any matmul.

Example::

    sizes = PairformerSizes.from_config(model_cfg)
    block_flops(2048, sizes)            # {"triangle_mult_out": ..., ..., "block": ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Model presets whose work this module describes (the reference trunk); other adapters are
# the user's own model and get no analytic count.
PAIRFORMER_TARGET = "cpbench.models.pairformer.adapter.PairformerAdapter"

# Forward recomputes per gradient pass under the reference trunk's nested checkpointing.
RECOMPUTE_PASSES = 2

BLOCK_OPS = ("triangle_mult_out", "triangle_mult_in", "triangle_att_start", "triangle_att_end",
             "pair_transition", "single_att_pair_bias", "single_transition")


@dataclass(frozen=True)
class PairformerSizes:
    """Channel sizes of one Pairformer block (names as in ``cpbench/conf/model/pairformer.yaml``)."""

    c_s: int = 384
    c_z: int = 128
    blocks: int = 64
    heads_single: int = 16
    heads_tri: int = 4
    head_dim_tri: int = 32
    transition_factor: int = 4

    @classmethod
    def from_config(cls, model_cfg: dict[str, Any]) -> "PairformerSizes":
        defaults = cls()
        return cls(**{k: int(model_cfg.get(k) if model_cfg.get(k) is not None else getattr(defaults, k))
                      for k in cls.__dataclass_fields__})


def block_flops(n_tokens: int, sizes: PairformerSizes) -> dict[str, float]:
    """Forward matmul FLOPs of one Pairformer block at ``n_tokens`` tokens, per op and in all.

    Per op (N tokens, c = c_z, H_t x d_t triangle heads, n = transition factor):
      triangle multiplication (each direction): 4 gated input projections c->c and the output
        projection + gate c->c: 12 N^2 c^2; the triangular product sum_k a_ik b_jk: 2 N^3 c.
      triangle attention (each of start/end node): q, k, v, gate c->H_t d_t and output
        H_t d_t->c: 10 N^2 c H_t d_t; triangle bias c->H_t: 2 N^2 c H_t; scores and values over
        N rows: 4 N^3 H_t d_t.
      pair transition (SwiGLU, x n): 6 n N^2 c^2.
      single attention with pair bias (c_s channels in heads_single heads): q, k, v, gate and
        output c_s->c_s: 10 N c_s^2; pair bias c->heads_single: 2 N^2 c heads_single; scores and
        values: 4 N^2 c_s.
      single transition (SwiGLU, x n): 6 n N c_s^2.

    Returns:
        ``{op: flops}`` for each name in ``BLOCK_OPS`` plus ``"block"``, the sum.
    """
    n = float(n_tokens)
    c, cs = sizes.c_z, sizes.c_s
    tri_hd = sizes.heads_tri * sizes.head_dim_tri
    tri_mult = 12 * n**2 * c**2 + 2 * n**3 * c
    tri_att = 10 * n**2 * c * tri_hd + 2 * n**2 * c * sizes.heads_tri + 4 * n**3 * tri_hd
    ops = {
        "triangle_mult_out": tri_mult,
        "triangle_mult_in": tri_mult,
        "triangle_att_start": tri_att,
        "triangle_att_end": tri_att,
        "pair_transition": 6 * sizes.transition_factor * n**2 * c**2,
        "single_att_pair_bias": 10 * n * cs**2 + 2 * n**2 * c * sizes.heads_single + 4 * n**2 * cs,
        "single_transition": 6 * sizes.transition_factor * n * cs**2,
    }
    ops["block"] = sum(ops[k] for k in BLOCK_OPS)
    return ops


def step_flops(n_tokens: int, sizes: PairformerSizes, *, train: bool, recycles: int = 0,
               checkpointing: bool = False, recompute_passes: int = RECOMPUTE_PASSES,
               checkpoint_ops: bool = True) -> dict[str, float | str]:
    """FLOPs of one benchmark step of the Pairformer (``sizes.blocks`` blocks per pass).

    Args:
        recompute_passes: forward recomputes per gradient pass with ``checkpointing`` and its ops
            checkpointed inside each block (``checkpoint_ops``, ``model.checkpoint_ops``); with the
            blocks only checkpointed, one.

    Returns:
        ``{"forward": one trunk pass, "step": the step's model FLOPs (MFU), "hardware": with
        checkpoint recomputes, "multiplier": step/forward, "basis": one line saying what is
        counted}``.
    """
    forward = sizes.blocks * block_flops(n_tokens, sizes)["block"]
    if train:
        multiplier = recycles + 3.0
        recompute = (recompute_passes if checkpoint_ops else 1) if checkpointing else 0
        nesting = "nested block then op" if checkpoint_ops else "the blocks"
        basis = (f"training: {recycles} no-grad recycle pass(es) + forward/backward 3x"
                 + (f" (activation checkpointing recomputes {recompute}x more, {nesting}: "
                    f"not in MFU)" if checkpointing else ""))
    else:
        multiplier, recompute = recycles + 1.0, 0
        basis = f"inference: {recycles + 1} trunk pass(es) of {sizes.blocks} blocks"
    return {"forward": forward, "step": forward * multiplier, "hardware": forward * (multiplier + recompute),
            "multiplier": multiplier, "basis": basis}


def is_reference_trunk(model_cfg: dict[str, Any] | None) -> bool:
    """Whether a result's model config is the reference Pairformer (the analytic count applies)."""
    if not model_cfg:
        return False
    target = model_cfg.get("_target_")
    if target is not None:
        return str(target) == PAIRFORMER_TARGET
    return model_cfg.get("name") in ("pairformer", "boltz2", "af3", "tiny")
