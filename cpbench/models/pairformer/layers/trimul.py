"""Triangle multiplication, outgoing and incoming edges (AF3 Algorithms 12-13).

Outgoing: ``x_ij = sum_k a_ik b_jk``; incoming: ``x_ij = sum_k a_ki b_kj``. Incoming on Z is
outgoing on Z^T with the roles of a and b swapped (``x^T_ji = sum_k b^T_jk a^T_ik``), so the op
always takes the row shard of the tensor it reads along rows: Z for outgoing, Z^T for incoming
(the block switches with ``transpose.transpose_pair``). Then the row operand ("left") is local and
the other ("right") is needed for every row: serial, a batched matmul over channels; 1d,
gathered from all ranks in row chunks so no rank ever holds a full ``N x N x c`` operand.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cpbench.models.pairformer.ops.fused import triangle_operands, triangle_update
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.ops.triangle_product import CANNON_OPERAND_COPIES, triangle_product
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.padding import pair_mask


class TriangleMultiplication(nn.Module):
    """Triangle multiplicative update (AF3 Alg. 12 outgoing, Alg. 13 incoming).

    ``forward(z, token_mask, layout)`` takes ``z: [N/P, N, c_z]``, the row shard of Z
    (outgoing) or of Z^T (incoming), and returns z plus the update in the same layout. Without
    autograd the update is added in place and the work is chunked: over channels for the
    projections and the product (the full ``[c, N/P, N]`` product plus two channel chunks of
    the operands live at once; in serial and 1d the first chunks keep their operands in the
    product's unfilled channels, ``chunking.scratch_channel_chunks``), over rows for the output
    stage. With autograd the same chunks are checkpointed when the op's activations would not
    fit the budget (``chunking.py``).
    """

    def __init__(self, c_z: int, incoming: bool = False) -> None:
        super().__init__()
        self.incoming = incoming
        self.norm_in = LayerNorm(c_z)
        self.proj_in = nn.Linear(c_z, 2 * c_z, bias=False)  # [a; b]
        self.gate_in = nn.Linear(c_z, 2 * c_z, bias=False)
        self.norm_out = LayerNorm(c_z)
        self.proj_out = nn.Linear(c_z, c_z, bias=False)
        self.gate_out = nn.Linear(c_z, c_z, bias=False)

    def _operands(self, z: torch.Tensor, mask: torch.Tensor, cs: slice,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Channels ``cs`` of the gated, masked (left, right) operands of rows ``z: [r, N, c_z]``
        (LayerNorm inside), each ``[len(cs), r, N]``; written into ``out`` (left, right) when given."""
        c = self.proj_in.out_features // 2
        a_idx, b_idx = slice(cs.start, cs.stop), slice(c + cs.start, c + cs.stop)
        w = torch.cat([self.proj_in.weight[a_idx], self.proj_in.weight[b_idx],
                       self.gate_in.weight[a_idx], self.gate_in.weight[b_idx]])
        # Channel-first projection, ``[4k, r*N] = W @ zn^T``: the operands come out in the
        # ``[k, r, N]`` layout the product batches over. (Projecting to ``[r, N, 4k]`` and
        # permuting cost a transposing copy that took half of the op's GPU time.)
        a_out, b_out = (None, None) if out is None else (out[::-1] if self.incoming else out)
        a, b = triangle_operands(z, self.norm_in.weight, self.norm_in.bias, w, mask[..., 0], a_out, b_out)
        return (b, a) if self.incoming else (a, b)

    def _update(self, x_rows: torch.Tensor, z_rows: torch.Tensor, residual: bool = False) -> torch.Tensor:
        """Output stage for rows: ``x_rows: [r, N, c]``, ``z_rows: [r, N, c_z]`` -> ``[r, N, c_z]``;
        with ``residual``, ``z_rows`` plus the update (in place without autograd: ``z_rows``)."""
        return triangle_update(x_rows, z_rows, self.norm_out.weight, self.norm_out.bias, self.norm_in.weight,
                               self.norm_in.bias, self.proj_out.weight, self.gate_out.weight, residual)

    def forward(self, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        """Args: ``z: [N/P, N, c_z]``, ``token_mask: [N]`` bool. Returns ``[N/P, N, c_z]``."""
        n_local, n_pad, c_z = z.shape
        rows = layout.rows(token_mask.shape[0])
        mask = pair_mask(token_mask, rows, z.dtype, layout.cols(token_mask.shape[0]))
        if torch.is_grad_enabled():
            return self._forward_autograd(z, mask, layout)
        return self._forward_lean(z, mask, layout)

    def _product_chunk(self, z: torch.Tensor, mask: torch.Tensor, cs: slice, layout: Layout) -> torch.Tensor:
        """Channels ``cs`` of the triangle product: ``[len(cs), N/P, N]``."""
        left, right = self._operands(z, mask, cs)
        return triangle_product(left.contiguous(), right.contiguous(), layout)

    def _update_rows(self, x_rows: torch.Tensor, z_rows: torch.Tensor) -> torch.Tensor:
        """``x_rows: [c, r, N]``, ``z_rows: [r, N, c_z]`` -> ``z_rows`` plus the update, ``[r, N, c_z]``
        (a new tensor: autograd)."""
        return self._update(x_rows.permute(1, 2, 0), z_rows, residual=True)

    @staticmethod
    def _operand_row_bytes(n_pad: int, c_z: int, k: int, es: int) -> int:
        """Transient bytes per row while ``_operands`` computes ``k`` channels (LayerNorm'd z
        and the ``4k`` projections)."""
        return n_pad * (2 * c_z + 8 * k) * es

    def _scratch_max(self, n_local: int, n_pad: int, c_z: int, es: int, budget_b: int, layout: Layout) -> int:
        """The largest power-of-two channel chunk whose operand rows clear the chunk floor under
        ``budget_b``; 0 in 2d, where the Cannon walk copies its operands (``CANNON_OPERAND_COPIES``)
        and the chunk must stay within the budget."""
        if layout.kind == TWO_D:
            return 0
        k = chunking.pow2_floor(c_z)
        while k >= 1 and not chunking.clears_floor(n_local, self._operand_row_bytes(n_pad, c_z, k, es), budget_b):
            k //= 2
        return k

    def _forward_autograd(self, z: torch.Tensor, mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        n_local, n_pad, c_z = z.shape
        pair_b = z.numel() * z.element_size()
        budget_b = chunking.budget_bytes(z)
        if 16 * pair_b <= budget_b:  # every activation of the op fits: no recompute
            left, right = self._operands(z, mask, slice(0, c_z))
            x = triangle_product(left.contiguous(), right.contiguous(), layout)
            return self._update(x.permute(1, 2, 0), z, residual=True)  # z plus the update, a new tensor
        # Checkpointed chunks: channels for the product, rows for the output stage, so backward
        # keeps z, x and one chunk's activations (~14 pair-sized tensors per channel otherwise).
        ck = chunking.divisor_chunk(c_z, 14 * pair_b // c_z, max(budget_b - 2 * pair_b, 0))
        ck = comm.agree_min(ck, layout, z)  # each channel chunk runs collectives
        x = torch.cat([checkpoint(self._product_chunk, z, mask, cs, layout, use_reentrant=False)
                       for cs in chunking.slices(c_z, ck)])
        rc = chunking.rows_per_chunk(n_local, 10 * pair_b // n_local, budget_b)
        return torch.cat([checkpoint(self._update_rows, x_rows, z_rows, use_reentrant=False)
                          for x_rows, z_rows in zip(x.split(rc, dim=1), z.split(rc, dim=0))])

    def _forward_lean(self, z: torch.Tensor, mask: torch.Tensor, layout: Layout) -> torch.Tensor:
        n_local, n_pad, c_z = z.shape
        es = z.element_size()
        x = z.new_empty((c_z, n_local, n_pad))
        budget_b = chunking.budget_bytes(z)  # after x: on CUDA the budget is what is left free
        # Two operand chunks of ck channels live across the product (2d: the Cannon walk's copies
        # too); keep them within half the budget.
        copies = CANNON_OPERAND_COPIES if layout.kind == TWO_D else 2
        ck = chunking.divisor_chunk(c_z, copies * n_local * n_pad * es, budget_b // 2)
        # Every channel chunk re-reads all of z (LayerNorm and projections), so near the limit,
        # where ck is 1-2 channels, the early chunks keep their operands in x's unfilled channels
        # instead (chunking.scratch_channel_chunks): fewer, larger chunks and no allocation.
        ck_scratch = self._scratch_max(n_local, n_pad, c_z, es, budget_b // 2, layout)
        ck, ck_scratch = comm.agree_min((ck, ck_scratch), layout, z)  # each channel chunk runs collectives
        for cs, in_scratch in chunking.scratch_channel_chunks(c_z, ck, ck_scratch):
            k = cs.stop - cs.start
            if in_scratch:
                left, right = x[cs.stop:cs.stop + k], x[cs.stop + k:cs.stop + 2 * k]
            else:
                left = z.new_empty((k, n_local, n_pad))
                right = torch.empty_like(left)
            rc = chunking.rows_per_chunk(n_local, self._operand_row_bytes(n_pad, c_z, k, es), budget_b // 2)
            for rs in chunking.slices(n_local, rc):
                self._operands(z[rs], mask[rs], cs, out=(left[:, rs], right[:, rs]))
            triangle_product(left, right, layout, out=x[cs])
            del left, right
        rc = chunking.rows_per_chunk(n_local, n_pad * 6 * c_z * es, budget_b)
        for rs in chunking.slices(n_local, rc):
            self._update(x[:, rs].permute(1, 2, 0), z[rs], residual=True)  # z[rs] += update
        return z
