"""AF3 atom attention encoder (Algorithm 5, trunk use): atoms -> per-token single features.

Per atom ``c_l = W [ref_pos, ref_charge, atom_mask, onehot(element), onehot(name chars)]``
(one-hots as weight-row lookups, never materialised); atom-pair features ``p_lm`` only inside
the 32 x 128 windows of ``atom_windows.py`` (never ``N_atoms²``): offsets, inverse squared
distance and same-conformer flag, plus ``relu(c_l)``, ``relu(c_m)`` projections and a 3-layer
MLP; an atom transformer (``blocks`` x [AdaLN-conditioned attention with pair bias, conditioned
SwiGLU transition], the shared blocks of ``conditioned.py``); then ``a_i = mean_{l -> i} relu(W q_l)``
over the real atoms of token i.
``a`` (``[N, c_s]``) is added to the token features' ``s_inputs``, so it reaches the single
init and, through the embedder's outer sum ``W s_i + W s_j``, the pair init, as in AF3.

Windows are laid over the real atoms (``atom_windows.py``), so the output does not depend on
cp. Simplification (memory and time are what matter here): one LayerNorm feeds every block's
pair-bias projection (AF3: one per block); the bias of all blocks is projected at once, so
without autograd only ``[W, blocks*heads, 32, 128]`` lives, not the ``c_atompair`` pair.

Context parallelism (1d, ``P`` ranks): a rank holds the atoms of its tokens, ``A/P`` padded
slots (``layout.rows(A_pad)``, the data helpers' layout); atom features (O(N_atoms)) are
global on every rank. Per transformer block, keys/values of the local atoms are all-gathered
(``comm.all_gather_rows``: ``(P-1)·A/P·2·c_atom`` elements sent per rank; backward: a
reduce-scatter) so windows that reach across a rank boundary see their keys; the token
features are all-gathered once (``(P-1)·N/P·c_s`` elements). Queries, pair features and
attention stay local: per-rank memory O(N_atoms/P · 32·128).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from cpbench.data.synthetic import NUM_ELEMENTS, NUM_NAME_CHARS
from cpbench.models.pairformer.layers.atom_windows import KEYS, QUERIES, AtomWindows, atom_windows
from cpbench.models.pairformer.layers.conditioned import ConditionedAttention, ConditionedTransition
from cpbench.models.pairformer.ops.layer_norm import LayerNorm
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import Layout
from cpbench.models.pairformer.parallel.padding import MASKED_LOGIT

NAME_LEN = 4  # characters per atom name (``ref_atom_name_chars: [A, 4]``)
_OFF_ELEMENT = 5  # after ref_pos (3), ref_charge, atom_mask
_OFF_NAME = _OFF_ELEMENT + NUM_ELEMENTS
N_ATOM_FEATS = _OFF_NAME + NAME_LEN * NUM_NAME_CHARS  # 389, AF3's per-atom reference features
# (global query slots [W, 32], global key slots [W, 128]) -> [W, 32, 128, c_atompair]
PairExtra = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class AtomTransformerBlock(nn.Module):
    """One block of the atom transformer (AF3 Alg. 23-25) over windowed keys, built from the
    shared conditioned blocks of ``conditioned.py`` (AdaLN-conditioned on ``c``).

    ``forward(q, c, bias, windows, layout)``: ``q, c: [A/P, c_atom]`` local atoms (state and
    conditioning), ``bias: [W, heads, 32, 128]`` (pair bias + key mask). Returns ``[A/P, c_atom]``.
    Sends ``(P-1)·A/P·2·c_atom`` elements (the all-gather of this rank's keys and values).
    """

    def __init__(self, c_atom: int, heads: int, transition_factor: int) -> None:
        super().__init__()
        self.attention = ConditionedAttention(c_atom, c_atom, heads)
        self.transition = ConditionedTransition(c_atom, c_atom, transition_factor)

    @staticmethod
    def _attend(q: torch.Tensor, kv_all: torch.Tensor, bias: torch.Tensor, win: AtomWindows) -> torch.Tensor:
        """Windows ``win`` of queries ``q: [A/P, h, d]`` over ``kv_all: [A_pad, h, 2d]``
        (keys then values per head) -> ``[W, 32, h, d]``."""
        d = q.shape[-1]
        qw = q[win.query.clamp(min=0)].transpose(1, 2)  # [W, h, 32, d]
        kvw = kv_all[win.key.clamp(min=0)].transpose(1, 2)  # [W, h, 128, 2d]
        o = F.scaled_dot_product_attention(qw, kvw[..., :d], kvw[..., d:], attn_mask=bias)
        return o.transpose(1, 2)

    def forward(self, q: torch.Tensor, c: torch.Tensor, bias: torch.Tensor, win: AtomWindows,
                layout: Layout) -> torch.Tensor:
        qh, k, v, g = self.attention.project(q, c)  # [A/P, h, d]
        kv_all = comm.all_gather_rows(torch.cat([k, v], dim=-1).contiguous(), layout)  # [A_pad, h, 2d]
        taken = win.query >= 0  # each local real atom is the query of exactly one slot
        if torch.is_grad_enabled():
            o = self._attend(qh, kv_all, bias, win)
            attended = qh.new_zeros(qh.shape).index_put((win.query[taken],), o[taken])
        else:
            attended = torch.zeros_like(qh)
            h, d = qh.shape[-2:]
            per_window_b = (QUERIES * 2 * h * d + KEYS * 3 * h * d + h * QUERIES * KEYS) * qh.element_size()
            # The bias of every window already lives whole; transients of its order are no new peak.
            budget_b = max(chunking.budget_bytes(kv_all), bias.numel() * bias.element_size())
            wc = chunking.rows_per_chunk(win.count, per_window_b, budget_b)
            for ws in chunking.slices(win.count, wc):
                part = win.slice(ws)
                o = self._attend(qh, kv_all, bias[ws], part)  # [w, 32, h, d]
                # No boolean-mask indexing (a host sync: the sampler's denoiser is captured as a
                # CUDA graph): untaken slots add exact zeros to slot 0, each real atom gets its
                # one window's output (0 + x = x, so the sum is exact in any order).
                o = torch.where(taken[ws][..., None, None], o, 0.0)
                attended.index_add_(0, part.query.clamp(min=0).reshape(-1), o.reshape(-1, h, d))
            del kv_all
        q = q + self.attention.finish(attended, g, c)
        return q + self.transition(q, c)


class AtomAttentionEncoder(nn.Module):
    """``forward(feats, layout) -> a: [N_pad, c_token]`` (global, same on every rank).

    Features (global, padded by ``cpbench.data.sharding.pad_features`` with ``units = P``):
    ``ref_pos [A_pad, 3]``, ``ref_charge``, ``ref_element``, ``ref_space_uid``, ``atom_mask``,
    ``atom_to_token [A_pad]``, ``ref_atom_name_chars [A_pad, 4]``, ``token_mask [N_pad]``.
    """

    def __init__(self, c_atom: int, c_atompair: int, c_token: int, blocks: int = 3, heads: int = 4,
                 transition_factor: int = 2) -> None:
        super().__init__()
        if c_atom % heads:
            raise ValueError(f"c_atom={c_atom} must be a multiple of atom_heads={heads}")
        self.blocks_n, self.heads = blocks, heads
        self.atom_embed = nn.Linear(N_ATOM_FEATS, c_atom, bias=False)
        self.pair_offset = nn.Linear(3, c_atompair, bias=False)
        self.pair_distance = nn.Linear(1, c_atompair, bias=False)
        self.pair_valid = nn.Linear(1, c_atompair, bias=False)
        self.pair_query = nn.Linear(c_atom, c_atompair, bias=False)
        self.pair_key = nn.Linear(c_atom, c_atompair, bias=False)
        self.pair_mlp = nn.Sequential(
            nn.ReLU(), nn.Linear(c_atompair, c_atompair, bias=False), nn.ReLU(),
            nn.Linear(c_atompair, c_atompair, bias=False), nn.ReLU(), nn.Linear(c_atompair, c_atompair, bias=False))
        # No LayerNorm bias: it would add one constant per head to all logits (a softmax no-op).
        self.pair_norm = LayerNorm(c_atompair, bias=False)
        self.pair_bias = nn.Linear(c_atompair, max(1, blocks) * heads, bias=False)
        self.blocks = nn.ModuleList(AtomTransformerBlock(c_atom, heads, transition_factor) for _ in range(blocks))
        self.to_token = nn.Linear(c_atom, c_token, bias=False)

    def atom_single(self, feats: dict[str, torch.Tensor]) -> torch.Tensor:
        """``c: [A_pad, c_atom]``: AF3 Alg. 5 line 1 with the one-hots as weight-row lookups."""
        w = self.atom_embed.weight
        table = w.t()  # [389, c_atom]
        dense = torch.cat([feats["ref_pos"], feats["ref_charge"][:, None], feats["atom_mask"][:, None]], dim=-1)
        c = F.linear(dense.to(w.dtype), w[:, :_OFF_ELEMENT]) + F.embedding(feats["ref_element"] + _OFF_ELEMENT, table)
        chars = feats["ref_atom_name_chars"] + _OFF_NAME + NUM_NAME_CHARS * torch.arange(NAME_LEN, device=w.device)
        return c + F.embedding(chars, table).sum(1)

    def _pair_bias(self, feats: dict[str, torch.Tensor], c_all: torch.Tensor, win: AtomWindows,
                   a0: int, pair_extra: PairExtra | None = None) -> torch.Tensor:
        """Pair features of the windows, projected to every block's bias plus the key mask:
        ``[W, blocks*heads, 32, 128]`` (AF3 Alg. 5 lines 2-6, 14). ``pair_extra(qg, kg)`` (global
        query slots ``[W, 32]``, key slots ``[W, 128]``) adds a term to ``p_lm`` before the MLP:
        the diffusion module's trunk-pair conditioning (AF3 Alg. 5 line 9)."""
        dtype = c_all.dtype
        qg, kg = torch.where(win.query >= 0, win.query + a0, 0), win.key.clamp(min=0)
        pos, uid = feats["ref_pos"].to(dtype), feats["ref_space_uid"]
        offset = pos[qg][:, :, None] - pos[kg][:, None]  # [W, 32, 128, 3]
        same = (uid[qg][:, :, None] == uid[kg][:, None]) & (win.query >= 0)[:, :, None] & (win.key >= 0)[:, None]
        v = same[..., None].to(dtype)
        inv_d2 = 1.0 / (1.0 + offset.square().sum(-1, keepdim=True))
        p = (self.pair_offset(offset) + self.pair_distance(inv_d2)) * v + self.pair_valid(v)
        cr = F.relu(c_all)
        p = p + self.pair_query(cr[qg])[:, :, None] + self.pair_key(cr[kg])[:, None]
        if pair_extra is not None:
            p = p + pair_extra(qg, kg)
        p = p + self.pair_mlp(p)
        bias = self.pair_bias(self.pair_norm(p)).permute(0, 3, 1, 2)
        key_mask = torch.where(win.key >= 0, 0.0, MASKED_LOGIT).to(dtype)
        return bias + key_mask[:, None, None, :]

    def all_pair_bias(self, feats: dict[str, torch.Tensor], c_all: torch.Tensor, win: AtomWindows,
                       a0: int, pair_extra: PairExtra | None = None) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self._pair_bias(feats, c_all, win, a0, pair_extra)
        bias = c_all.new_empty((win.count, self.pair_bias.out_features, QUERIES, KEYS))
        c_ap = self.pair_norm.normalized_shape[0]
        per_window_b = QUERIES * KEYS * (6 * c_ap + 2 * bias.shape[1]) * c_all.element_size()
        wc = chunking.rows_per_chunk(win.count, per_window_b, chunking.budget_bytes(c_all))
        for ws in chunking.slices(win.count, wc):
            bias[ws] = self._pair_bias(feats, c_all, win.slice(ws), a0, pair_extra)
        return bias

    def forward(self, feats: dict[str, torch.Tensor], layout: Layout) -> torch.Tensor:
        """Returns ``a: [N_pad, c_token]`` in the weights' dtype, 0 on tokens without real atoms."""
        n_pad, a_pad = feats["token_mask"].shape[0], feats["atom_mask"].shape[0]
        rows, local = layout.rows(n_pad), layout.rows(a_pad)
        win = atom_windows(feats["atom_mask"], local)
        c_all = self.atom_single(feats)  # [A_pad, c_atom], O(N_atoms): cheaper than gathering it
        bias = self.all_pair_bias(feats, c_all, win, local.start)
        c = c_all[local]
        q = c
        h = self.heads
        for i, block in enumerate(self.blocks):
            q = block(q, c, bias[:, i * h:(i + 1) * h], win, layout)
        del bias
        return comm.all_gather_rows(self._to_tokens(q, feats, local, rows), layout)

    def _to_tokens(self, q: torch.Tensor, feats: dict[str, torch.Tensor], local: slice, rows: slice) -> torch.Tensor:
        """Mean of ``relu(W q_l)`` over the real local atoms of each local token: ``[N/P, c_token]``.

        The data layout puts every atom on the rank of its token (padding atoms point at the
        last token of their block), so ``atom_to_token - rows.start`` indexes local tokens."""
        x = F.relu(self.to_token(q))
        real = feats["atom_mask"][local].to(x.dtype)
        token = feats["atom_to_token"][local] - rows.start
        n_local = rows.stop - rows.start
        sums = x.new_zeros((n_local, x.shape[-1])).index_add(0, token, x * real[:, None])
        counts = x.new_zeros(n_local).index_add(0, token, real).clamp(min=1)
        return sums / counts[:, None]
