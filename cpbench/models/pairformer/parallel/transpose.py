"""Pair transposes: the local shard of ``Z^T`` from the local shard of ``Z``.

* 1d (``transpose_pair``): one all-to-all turns the row shard of Z into the row shard of Z^T
  (channel-chunked); the backward is the reverse all-to-all.
* 2d (``transpose_tiles``): the tile of ``X^T`` (``X^T[R_a, C_b] = X[C_b, R_a]^T``). Square
  grids: one swap with rank ``(b, a)``; non-square: the pieces of ``X[C_b, R_a]`` from every rank
  whose tile overlaps it. A permutation of elements, so its backward is itself.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.grid import Grid, block, overlap
from cpbench.models.pairformer.parallel.layout import TWO_D, Layout
from cpbench.models.pairformer.parallel.p2p import TAG_SKEW, exchange, wait_all


def _wordable(t: torch.Tensor, ratio: int) -> bool:
    """Whether ``t`` views as 8-byte words (``ratio`` of its elements each): its innermost dim
    contiguous, and that dim's length, every other stride, its offset and its address aligned."""
    return (t.dim() > 0 and t.stride(-1) == 1 and t.shape[-1] % ratio == 0 and t.storage_offset() % ratio == 0
            and all(stride % ratio == 0 for stride in t.stride()[:-1]) and t.data_ptr() % 8 == 0)


def _copy_words_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` (same shape and dtype) as 8-byte words where both views allow it, else as
    it is; returns ``dst``.

    The transposes' block permutations are strided copies with a contiguous innermost dim, which
    PyTorch's CUDA copy runs through its strided element-wise kernel one element per thread step,
    without vector loads: on one H200 (2026-12-06, N=2,048, cp=2) such a copy of a 512 MiB shard
    took 0.665 ms, about 1.6 TB/s of reads and writes. As int64 words a bf16 copy has a quarter
    of the elements for the same bytes (not yet timed)."""
    ratio = 8 // src.element_size() if 8 % src.element_size() == 0 else 0
    if ratio > 1 and src.dtype == dst.dtype and _wordable(src, ratio) and _wordable(dst, ratio):
        dst.view(torch.int64).copy_(src.view(torch.int64))
        return dst
    return dst.copy_(src)


def _packed(src: torch.Tensor) -> torch.Tensor:
    """``src.contiguous()`` through ``_copy_words_``."""
    return _copy_words_(torch.empty(src.shape, dtype=src.dtype, device=src.device), src)


def _transpose_into(out: torch.Tensor, t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
    """``out`` <- tile of ``X^T`` from the tile ``t`` of ``X`` (token dims ``dim``, ``dim + 1``).

    ``out`` may be ``t`` itself: every outgoing piece is copied out before anything is written.
    """
    p, q = grid.cp0, grid.cp1
    n_pad = t.shape[dim] * p
    rows, cols = grid.rows(n_pad), grid.cols(n_pad)

    def region(x: torch.Tensor, r: slice, c: slice) -> torch.Tensor:
        return x.narrow(dim, r.start, r.stop - r.start).narrow(dim + 1, c.start, c.stop - c.start)

    def local(x: slice, origin: slice) -> slice:
        return slice(x.start - origin.start, x.stop - origin.start)

    sends, recvs, places = [], [], []
    for a2 in range(p):
        for b2 in range(q):
            peer = grid.rank_of(a2, b2)
            peer_rows, peer_cols = block(a2, p, n_pad), block(b2, q, n_pad)
            # Mine -> peer: X[R_a ∩ C_b2, C_b ∩ R_a2], transposed, lands at peer rows C_b ∩ R_a2.
            rs, cs = overlap(rows, peer_cols), overlap(cols, peer_rows)
            if rs is not None and cs is not None:
                piece = region(t, local(rs, rows), local(cs, cols)).transpose(dim, dim + 1)
                piece = piece.clone(memory_format=torch.contiguous_format)
                if peer == grid.me:
                    places.append((region(out, local(cs, rows), local(rs, cols)), piece))
                else:
                    sends.append((peer, piece))
            # Peer -> mine: X[R_a2 ∩ C_b, C_b2 ∩ R_a] transposed, at my rows C_b2 ∩ R_a, cols R_a2 ∩ C_b.
            my_r, my_c = overlap(peer_cols, rows), overlap(peer_rows, cols)
            if peer != grid.me and my_r is not None and my_c is not None:
                dst = region(out, local(my_r, rows), local(my_c, cols))
                if dst.is_contiguous():  # square grids: the whole tile, received in place
                    recvs.append((peer, dst))
                else:
                    buf = torch.empty(dst.shape, dtype=t.dtype, device=t.device)
                    recvs.append((peer, buf))
                    places.append((dst, buf))
    wait_all(exchange(sends, recvs, TAG_SKEW))
    for dst, buf in places:
        dst.copy_(buf)
    return out


def _transpose_tiles(t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
    return _transpose_into(torch.empty_like(t, memory_format=torch.contiguous_format), t, grid, dim)


def transpose_tiles_(z: torch.Tensor, layout: Layout) -> torch.Tensor:
    """In-place ``transpose_tiles`` of a pair tile ``z: [N/cp0, N/cp1, c]`` without autograd,
    in channel chunks so that only two chunk-sized buffers are transient."""
    c = z.shape[-1]
    per_channel_b = 2 * z.numel() // c * z.element_size()
    ck = chunking.divisor_chunk(c, per_channel_b, chunking.budget_bytes(z))
    ck = comm.agree_min(ck, layout, z)
    while c % ck:  # the agreed minimum divides c only if it is one of ours
        ck -= 1
    for cs in chunking.slices(c, ck):
        view = z[..., cs]
        _transpose_into(view, view, layout.grid, 0)
    return z


class _TransposeTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, grid: Grid, dim: int) -> torch.Tensor:
        ctx.grid, ctx.dim = grid, dim
        return _transpose_tiles(t, grid, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _transpose_tiles(grad.contiguous(), ctx.grid, ctx.dim), None, None


def transpose_tiles(t: torch.Tensor, grid: Grid, dim: int = 0) -> torch.Tensor:
    """This rank's tile of ``X^T`` given its tile of ``X``.

    Args:
        t: ``[..., N/cp0, N/cp1, ...]`` tile ``X[R_a, C_b]`` with token dims ``dim, dim + 1``.
    Returns:
        Same shape: ``X^T[R_a, C_b]``, a new tensor. Sends ``|t|`` bytes (less the part that
        stays on this rank); autograd-aware (the backward is the same exchange).
    """
    if torch.is_grad_enabled() and t.requires_grad:
        return _TransposeTiles.apply(t, grid, dim)
    return _transpose_tiles(t, grid, dim)


def _transpose_1d(z: torch.Tensor, layout: Layout, in_place: bool = False, chunk_c: int | None = None) -> torch.Tensor:
    """All-to-all that turns the row shard of Z into the row shard of Z^T: a new contiguous tensor,
    or ``z`` itself with ``in_place`` (``z`` contiguous: each channel chunk is packed into the send
    buffer before its received blocks land in the same channels of ``z``).

    Channel-chunked so the send/receive buffers stay within the chunk budget (``chunk_c``: the
    channels per chunk, already agreed over the ranks; by default from the budget for two buffers).
    """
    p, n_local, c = layout.size, z.shape[0], z.shape[2]
    out = z if in_place else torch.empty_like(z, memory_format=torch.contiguous_format)
    # out[j, s-block i, :] = Z[i in s, j mine]: block s of the result comes from rank s.
    out_blocks = out.view(n_local, p, n_local, c)
    if chunk_c is None:
        per_channel_b = 2 * z.numel() * z.element_size() // c
        chunk_c = comm.agree_min(chunking.divisor_chunk(c, per_channel_b, chunking.budget_bytes(z)), layout, z)
    for cs in chunking.slices(c, chunk_c):
        # send[s] = my rows, the columns of rank s: [P, n_local(i), n_local(j), chunk]
        send = _packed(z[..., cs].reshape(n_local, p, n_local, cs.stop - cs.start).permute(1, 0, 2, 3))
        recv = torch.empty_like(send)
        # Emulated (fake group): every peer sent what this rank sent, so on a GPU the blocks are
        # unpacked from ``send``; ``recv`` is allocated, as in a real run, and whatever the fake
        # backend writes there is clocked as link work. On a CPU it is filled: peaks there are
        # resident memory, and gloo writes it.
        with comm.link_work(layout.group, recv):
            dist.all_to_all_single(recv, send, group=layout.group)
            if comm.is_fake(layout.group) and recv.device.type == "cpu":
                recv.copy_(send)
        comm.BYTES.add((p - 1) * send.numel() * send.element_size() / p, "all_to_all")
        landed = send if comm.is_fake(layout.group) else recv
        _copy_words_(out_blocks[..., cs], landed.permute(2, 0, 1, 3))
        del send, recv, landed
    return out


def _landed_storage(z: torch.Tensor, p: int) -> torch.Tensor | None:
    """``[P, n, n, c]`` storage of ``z: [n, N, c]`` when ``z`` is the view ``_transpose_1d_whole``
    returns from row-major input (``z.transpose(0, 1)`` contiguous), else None. Its block ``t``,
    ``storage[t, b, a] = z[a, t·n + b]``, is what rank ``t`` needs, contiguous."""
    n, c = z.shape[0], z.shape[2]
    if z.is_contiguous() or not z.transpose(0, 1).is_contiguous():
        return None
    return z.transpose(0, 1).view(p, n, n, c)


def _transpose_1d_whole(z: torch.Tensor, layout: Layout, storage: torch.Tensor | None) -> torch.Tensor:
    """No autograd, one all-to-all of the whole shard and one copy, for ``z: [n, N, c]`` either
    row-major or the view this function returns (all ranks hold the same layout: they run the same
    ops); the one shard-sized transient is a send or receive buffer.

    * Row-major ``z``: its blocks are packed ``[P, n(a), n(b), c]`` (a block permutation: runs of
      ``n·c`` contiguous elements) and the received blocks land in ``z``'s own storage; the result
      is the view ``landed.view(N, n, c).transpose(0, 1)`` of it, no unpacking.
    * ``z`` such a view: its storage holds each peer's block already transposed and contiguous
      (``_landed_storage``), so it is sent as it is, and the received blocks are unpacked (a block
      permutation again) into that storage, row-major.

    Two transposes in a row thus copy the shard twice, each copy a block permutation; the
    chunked path (``_transpose_1d``) copies it four times, two of them element transposes.
    Emulated (fake group) no peer's blocks land: row-major, ``z``'s storage keeps this rank's own
    values or the send buffer that the fake backend copies there (torch 2.13; clocked as link work,
    ``comm.link_work``); from the view, the blocks are unpacked from what this rank sent
    into the receive buffer, which is then the result (same size; ``z``'s storage is freed when
    the caller drops ``z``).
    ``storage``: ``_landed_storage(z, P)``, None for row-major ``z``.
    """
    p, n, c = layout.size, z.shape[0], z.shape[2]
    sent_b = (p - 1) * z.numel() * z.element_size() / p
    if storage is None:  # row-major
        send = _packed(z.view(n, p, n, c).permute(1, 0, 2, 3))  # [P, n(a), n(b), c]
        landed = z.view(p, n, n, c)  # landed[s, a, b] = Z_s[a, me·n + b]
        with comm.link_work(layout.group, landed):
            dist.all_to_all_single(landed, send, group=layout.group)
        comm.BYTES.add(sent_b, "all_to_all")
        del send
        return landed.view(p * n, n, c).transpose(0, 1)  # [n(b), N(s·n + a), c]
    recv = torch.empty_like(storage)  # recv[s, b, a] = Z_s[a, me·n + b]
    with comm.link_work(layout.group, recv):
        dist.all_to_all_single(recv, storage, group=layout.group)
    comm.BYTES.add(sent_b, "all_to_all")
    if comm.is_fake(layout.group):
        out = recv.view(n, p, n, c)
        _copy_words_(out, storage.permute(1, 0, 2, 3))
    else:
        out = storage.view(n, p, n, c)
        _copy_words_(out, recv.permute(1, 0, 2, 3))
    return out.view(n, p * n, c)


def _transpose_1d_no_grad(z: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Without autograd: the whole shard at once (``_transpose_1d_whole``) when the budget holds
    one shard-sized buffer and ``z`` is row-major or that function's view; else in place in
    channel chunks of two buffers within the budget (``_transpose_1d``). One agreement decides."""
    p, c = layout.size, z.shape[2]
    per_channel_b = z.numel() * z.element_size() // c
    chunk_c = comm.agree_min(chunking.divisor_chunk(c, per_channel_b, chunking.budget_bytes(z)), layout, z)
    storage = _landed_storage(z, p)
    if chunk_c == c and (z.is_contiguous() or storage is not None):
        return _transpose_1d_whole(z, layout, storage)
    half = chunking.divisor_chunk(c, 1, chunk_c // 2)  # two buffers: the largest divisor of c within half
    if not z.is_contiguous():
        return z.copy_(_transpose_1d(z, layout, chunk_c=half))
    return _transpose_1d(z, layout, in_place=True, chunk_c=half)


class _TransposePair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, layout: Layout) -> torch.Tensor:
        ctx.layout = layout
        return _transpose_1d(z, layout)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _transpose_1d(grad.contiguous(), ctx.layout), None


def transpose_pair(z: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The local row shard of the transposed pair tensor ``Z^T`` (``Z^T[j, i] = Z[i, j]``).

    Args:
        z: ``[N/P, N, c]`` rows of Z held by this rank.
    Returns:
        ``[N/P, N, c]`` rows of Z^T. Serial: a view (no copy). 1d: one all-to-all sending
        ``(P-1)/P·|z|`` bytes. Without autograd the result lives in ``z``'s storage: where the
        budget holds one more shard, as a whole-shard exchange whose result may be a strided view
        (``_transpose_1d_whole``: the serial layout's ``z.transpose(0, 1)`` has the same
        strides, so every op takes it); else written channel chunk by channel chunk (the only
        shard-sized buffers are the chunked send and receive buffers). Callers rebind ``z`` to
        the result before the next op (``z = transpose_pair(z, layout)``): emulated, the whole
        exchange's result from a strided view is the receive buffer instead. With autograd a new
        tensor whose backward is the reverse all-to-all.
    """
    if not layout.sharded:
        return z.transpose(0, 1)
    if layout.kind == TWO_D:  # tile [N/cp0, N/cp1, c]: point-to-point grid transpose
        if torch.is_grad_enabled():
            return transpose_tiles(z, layout.grid, dim=0)
        return transpose_tiles_(z, layout)  # in place, in channel chunks
    if torch.is_grad_enabled():
        return _TransposePair.apply(z, layout)
    return _transpose_1d_no_grad(z, layout)
