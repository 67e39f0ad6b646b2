"""Input embedding of the trunk: token features and relative position encoding (AF3 Alg. 1-3).

``s_inputs`` (AF3's per-token input features; the atom encoder adds to it) is O(N)
and computed globally on every rank; the pair init ``z_ij = W_i s_inputs_i + W_j s_inputs_j +
relpos(i, j)`` is computed only for the rows a rank holds, so no rank ever builds a global
``N x N x c`` tensor. The relative position one-hots (AF3 Alg. 3, 139 channels) are never
materialised: a LinearNoBias of a one-hot is a row lookup of its weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.data.vocab import NUM_RESTYPES

R_MAX, S_MAX = 32, 2  # AF3 relative-position clips (residues/tokens, chains)
_N_REL = 2 * R_MAX + 2  # 66 one-hot bins: clipped offsets + "different chain"
_N_CHAIN = 2 * S_MAX + 2  # 6
# Offsets of each one-hot block inside AF3's 139-channel relpos feature.
_OFF_RES, _OFF_TOK, _OFF_ENT, _OFF_CHAIN = 0, _N_REL, 2 * _N_REL, 2 * _N_REL + 1
N_RELPOS = 2 * _N_REL + 1 + _N_CHAIN
N_TOKEN_FEATS = 2 * NUM_RESTYPES + 1  # restype one-hot, MSA profile, deletion mean


class InputEmbedder(nn.Module):
    """Token features -> ``s_inputs``, ``s_init`` and rows of ``z_init``.

    Features (global, padded, ``[N]`` unless stated): ``res_type``, ``residue_index``,
    ``token_index``, ``asym_id``, ``entity_id``, ``sym_id``, ``profile [N, 32]``,
    ``deletion_mean``.
    """

    def __init__(self, c_s: int, c_z: int) -> None:
        super().__init__()
        self.token_proj = nn.Linear(N_TOKEN_FEATS, c_s, bias=False)
        self.single_init = nn.Linear(c_s, c_s, bias=False)
        self.pair_left = nn.Linear(c_s, c_z, bias=False)
        self.pair_right = nn.Linear(c_s, c_z, bias=False)
        self.relpos = nn.Linear(N_RELPOS, c_z, bias=False)

    def single_inputs(self, feats: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[N, c_s]`` in the weights' dtype."""
        dtype = self.token_proj.weight.dtype
        x = torch.cat([F.one_hot(feats["res_type"], NUM_RESTYPES).to(dtype), feats["profile"].to(dtype),
                       feats["deletion_mean"].to(dtype)[:, None]], dim=-1)
        return self.token_proj(x)

    def single_init_rows(self, s_inputs: torch.Tensor, rows: slice) -> torch.Tensor:
        """``[len(rows), c_s]``."""
        return self.single_init(s_inputs[rows])

    def pair_init_rows(self, s_inputs: torch.Tensor, feats: dict[str, torch.Tensor], rows: slice,
                       cols: slice = slice(None)) -> torch.Tensor:
        """Rows ``rows`` (columns ``cols``: a 2d tile) of the pair init: ``[len(rows), len(cols), c_z]``."""
        left = self.pair_left(s_inputs[rows])  # [r, c_z]
        right = self.pair_right(s_inputs[cols])  # [N, c_z]
        return left[:, None] + right[None] + self._relpos_rows(feats, rows, cols)

    def _relpos_rows(self, feats: dict[str, torch.Tensor], rows: slice, cols: slice = slice(None)) -> torch.Tensor:
        """AF3 Alg. 3 for rows ``rows`` and columns ``cols``: ``[len(rows), len(cols), c_z]``."""
        def pair(key: str) -> tuple[torch.Tensor, torch.Tensor]:
            v = feats[key]
            return v[rows, None], v[None, cols]

        (asym_i, asym_j), (ent_i, ent_j) = pair("asym_id"), pair("entity_id")
        (res_i, res_j), (tok_i, tok_j), (sym_i, sym_j) = pair("residue_index"), pair("token_index"), pair("sym_id")
        same_chain, same_entity = asym_i == asym_j, ent_i == ent_j
        far = 2 * R_MAX + 1
        d_res = torch.where(same_chain, (res_i - res_j + R_MAX).clamp(0, 2 * R_MAX), far)
        d_tok = torch.where(same_chain & (res_i == res_j), (tok_i - tok_j + R_MAX).clamp(0, 2 * R_MAX), far)
        d_chain = torch.where(~same_chain, (sym_i - sym_j + S_MAX).clamp(0, 2 * S_MAX), 2 * S_MAX + 1)
        table = self.relpos.weight.t()  # [139, c_z]: row k = the weight of one-hot channel k
        out = F.embedding(d_res + _OFF_RES, table) + F.embedding(d_tok + _OFF_TOK, table)
        out = out + F.embedding(d_chain + _OFF_CHAIN, table)
        return out + same_entity[..., None].to(table.dtype) * table[_OFF_ENT]
