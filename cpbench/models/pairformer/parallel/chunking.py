"""Chunk sizes from shapes and free memory: one place that decides how big a work slice is.

Without autograd the ops slice their work so that transient buffers fit a budget; with autograd
an op whose activations would not fit runs checkpointed chunks (backward keeps their inputs and
recomputes one chunk at a time). The budget:

* CUDA: ``min(0.4 × free, max(pair shard / 4, 0.1 × device memory))``. Free is what the
  caching allocator can hand out (device free + cached-but-unused, within a
  ``memory.limit_gib`` cap); device memory is the GPU's total (or the cap). The second term
  makes the budget a function of N and the device, not of how much happens to be free: a
  point's peak is then ``pair tensors + budget + constants``, a quadratic in N that the
  probe's ``predict`` strategy and the report's memory model can fit (with the free-memory
  share alone, the transients filled 40 % of whatever was free and the peak at N=4,096 was
  50.6 GiB against 59.7 at 8,192 on one H200). Chunks stay large (a tenth of the GPU) at the
  sizes people time, and the free-memory term still shrinks them near the limit.
* CPU: a quarter of the local pair shard, so transients scale with the shard like on a full GPU.

Tests force tiny chunks with ``override_budget`` to exercise the chunked paths.

Lean budgets (``lean_budgets``, the probe's fitting points through ``run_step(..., lean=True)``):
on CUDA a thirty-second of the pair shard or a hundredth of the device, whichever is larger,
whatever is free, so a step's peak is the model's irreducible memory (the pair tensors,
weights, per-token features) plus a sliver: a quadratic in N from which the probe predicts
where that memory meets the device's. (Without the hundredth, a full-depth step at N=1,024 ran
ops in chunks of a few rows and did not finish in 200 s on one H200.) At the max N the
normal budget is itself such a sliver (40 % of what the pair tensors leave free: about 2 GiB
against a 67 GiB pair at cp=1 on an H200), so the lean peak is also the limit's. The CPU
budget is already a function of the pair shard alone: lean changes nothing there.

Fail fast near the limit: a CUDA budget is a reading of free memory, so when it does not hold
even ``MIN_ROWS_PER_CHUNK`` rows of an op, the device is out of memory at this N for practical
purposes; rather than crawl through the op a row at a time (a probe point that runs for many
minutes before the next N fails anyway), ``rows_per_chunk`` raises ``ChunkBudgetFloor``, an
out-of-memory error the harness records as ``oom``. Only budgets read from free memory
(``FreeMemoryBudget``) carry the floor: the CPU budget is a size (a quarter of the pair shard,
which fits less than one row of some ops at small N and runs fine), an override is a choice.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch

_CUDA_FREE_FRACTION = 0.4    # share of the free memory one op's transients may take
_CUDA_DEVICE_FRACTION = 0.1  # the budget's size term: a tenth of the device memory ...
_PAIR_FRACTION = 4           # ... or a quarter of the pair shard, whichever is larger (CPU: the latter)
# Below this, per-chunk overhead dominates tiny CPU runs. 1 MiB (128 KiB until 2026-12-02): a
# tiny-preset inference step at N=32, cp=2, took 1.79 s with 128 KiB and 0.54 s with
# 1 MiB on the 2-core CI VM (the MSA module's S=256 row loops ran in chunks of a few rows), and
# the test suite runs hundreds of such steps. It binds only where the pair shard is under 4 MiB:
# the CPU quick start's limit (N=640 at cp=2, a 13 MiB shard) is under the quarter-shard rule.
_CPU_FLOOR_BYTES = 1 << 20
# A free-memory budget that holds fewer rows than this (or than the op has) means out of memory:
# one to three rows per chunk is where an op crawls (n_rows chunks, each too small to be fast).
MIN_ROWS_PER_CHUNK = 4
_LEAN_PAIR_FRACTION = 32       # lean budgets (CUDA): this fraction of the pair shard ...
_LEAN_DEVICE_FRACTION = 0.01   # ... or of the device memory, whichever is larger
_override_bytes: int | None = None
_lean = False


class ChunkBudgetFloor(torch.OutOfMemoryError):
    """The free-memory budget holds fewer than ``MIN_ROWS_PER_CHUNK`` rows of an op: out of
    memory at this N (a budget floor, not an allocator failure; ``harness.memory.is_oom``
    counts it as out of memory like any ``torch.OutOfMemoryError``)."""


class FreeMemoryBudget(int):
    """A chunk budget in bytes read from free device memory (``budget_bytes`` on CUDA): only such
    a budget can say "out of memory". Integer halving (``budget // 2``) keeps the kind; other
    arithmetic gives a plain int (no floor: the floor errs towards running the op)."""

    def __floordiv__(self, other):
        out = int.__floordiv__(self, other)
        return FreeMemoryBudget(out) if isinstance(other, int) and out is not NotImplemented else out


@contextlib.contextmanager
def override_budget(budget_bytes: int | None) -> Iterator[None]:
    """Use ``budget_bytes`` as the chunk budget inside the context (None: the default policy).
    A plain int (tests forcing tiny chunks) carries no floor; a ``FreeMemoryBudget`` passed on
    (a checkpoint's frozen budget, a budget agreed once for several calls) keeps its floor."""
    global _override_bytes
    previous, _override_bytes = _override_bytes, budget_bytes
    try:
        yield
    finally:
        _override_bytes = previous


def near_limit(pair: torch.Tensor) -> bool:
    """Whether an op over ``pair`` (this rank's pair shard) reads its own budget from free memory:
    a CUDA op outside a block's agreed ample budget, a lean budget or an override, i.e. near the
    memory limit. The lean paths keep their eager in-place adds and copies there
    (``ops/fused.py``): on one H200 the compiled in-place passes ran out of device memory (a CUDA
    error, not the allocator's) at N=16,000, where the flex path had fit up to 16,727 before; away
    from the limit they are what brought the N=2,048 pass under 6 s (docs/perf_notes.md,
    "Near-limit fixes that kept the max N")."""
    return pair.is_cuda and _override_bytes is None and not _lean


@contextlib.contextmanager
def lean_budgets(on: bool = True) -> Iterator[None]:
    """Inside the context (when ``on``) every CUDA budget is ``max(pair shard / 32, device /
    100)`` (a plain int: no floor), see the module docstring; ``override_budget`` still wins."""
    global _lean
    previous, _lean = _lean, bool(on) or _lean
    try:
        yield
    finally:
        _lean = previous


def frozen_budget(budget_b: int) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` for ``torch.utils.checkpoint``: the forward and the recompute of a
    checkpointed op see the same budget, so they chunk (and save tensors) identically even
    though the free memory differs between the two."""
    return override_budget(budget_b), override_budget(budget_b)


def budget_bytes(pair: torch.Tensor) -> int:
    """Bytes an op may spend on transient buffers, given the local pair shard ``pair``."""
    if _override_bytes is not None:
        return _override_bytes
    pair_b = pair.numel() * pair.element_size()
    if pair.is_cuda:
        free_b, capacity_b = _cuda_free_bytes(pair.device)
        if _lean:
            return _cuda_size_term(pair_b, capacity_b, _LEAN_PAIR_FRACTION, _LEAN_DEVICE_FRACTION)
        return FreeMemoryBudget(min(free_b * _CUDA_FREE_FRACTION, _cuda_size_term(pair_b, capacity_b)))
    return max(pair_b // _PAIR_FRACTION, _CPU_FLOOR_BYTES)


def _cuda_size_term(pair_b: int, capacity_b: int, pair_fraction: int = _PAIR_FRACTION,
                    device_fraction: float = _CUDA_DEVICE_FRACTION) -> int:
    """A CUDA budget's deterministic term: ``pair_b / pair_fraction`` or ``device_fraction`` of the
    device, whichever is larger (the normal budget's a quarter or a tenth; a lean one's a 32nd or
    a hundredth)."""
    return max(pair_b // pair_fraction, int(capacity_b * device_fraction))


def _cuda_free_bytes(device: torch.device) -> tuple[int, int]:
    """(bytes the caching allocator can hand out, this process's device memory).

    Free is device free plus cached-but-unused bytes, and within a per-process memory fraction
    (``memory.limit_gib``) what is left of it; the capacity is the device total times that fraction.
    """
    free_b, total_b = torch.cuda.mem_get_info(device)
    # One nested stats dict: ``memory_allocated`` and ``memory_reserved`` each flatten the whole
    # dict in Python (~95 us apiece on an H200 host against 13 us; a 64-block step reads the free
    # memory ~580 times, docs/perf_notes.md, "N=512 is host-bound").
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    allocated_b, reserved_b = stats["allocated_bytes"]["all"]["current"], stats["reserved_bytes"]["all"]["current"]
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    capacity_b = int(total_b * (get_fraction(device) if get_fraction is not None else 1.0))
    free_b = min(free_b + reserved_b - allocated_b, capacity_b - allocated_b)
    return max(free_b, 0), capacity_b


# An inference block whose op budgets are the device term whatever each op leaves free: room, on
# top of that term's free-memory share, for what an op holds beside z when it reads its budget
# (the triangle product's x, a transpose's output, the operands of a channel chunk: pair shards
# and budgets' worth of transients), with margin.
_AMPLE_PAIRS = 4
_AMPLE_BUDGETS = 2


def budgets_from_shapes(pair: torch.Tensor) -> bool:
    """Whether every budget an op reads beside ``pair`` is a function of tensor shapes alone, the
    same on every rank whose shard has the same shape: on a CPU (a quarter of the tensor, or an
    override, which tests and callers set alike on every rank). Then ranks need not agree on
    chunk sizes (``comm.agreed``)."""
    return not pair.is_cuda


def ample_budget(pair: torch.Tensor) -> int:
    """The budget every op of an inference block over the pair shard ``pair`` reads on this rank,
    when free memory cannot lower it: the device term (a tenth of the device), a
    ``FreeMemoryBudget``, if this rank's free memory holds that term's 40 % share with room for
    ``_AMPLE_PAIRS`` pair shards and ``_AMPLE_BUDGETS`` budgets besides; 0 otherwise (near the
    limit, under a lean or overridden budget, on a CPU), where each op reads its own.

    At the sizes people time, each op's ``budget_bytes`` is this same term (``min(0.4 × free,
    term)``), and one reading per block instead of one per op (and, under CP, one agreement
    instead of eight) gives the same chunks: the per-op readings and their host syncs are what a
    block at small N waits on (docs/perf_notes.md, "Small N is latency-bound").
    """
    if _override_bytes is not None or _lean or not pair.is_cuda:
        return 0
    free_b, capacity_b = _cuda_free_bytes(pair.device)
    pair_b = pair.numel() * pair.element_size()
    term_b = int(capacity_b * _CUDA_DEVICE_FRACTION)
    if pair_b // _PAIR_FRACTION > term_b:  # the size term is the pair's quarter: N-dependent, large N
        return 0
    room_b = free_b - _AMPLE_PAIRS * pair_b - _AMPLE_BUDGETS * term_b
    return FreeMemoryBudget(term_b) if room_b * _CUDA_FREE_FRACTION >= term_b else 0


# Pair-shard-sized tensors the backward of one checkpointed block holds besides the chunks of the
# op it recomputes: the recomputed op inputs (about five) and the gradient buffers (about three).
BACKWARD_PAIRS = 8
_MIN_TRAINING_BUDGET_BYTES = 64 << 20
# A training budget is rounded down to a multiple of an eighth of its size term (a power of two
# below that), so the 64 blocks of a step, each reading free memory as the saved block inputs
# pile up, see a handful of budgets, not up to 64: the compiled training path compiles once per
# chunk shape, and near the limit every block could read a new budget, so a new shape to compile.
_TRAINING_BUDGET_STEPS = 8
# Lean training budgets: this many pair shards (at most the normal size term), or the lean term
# if larger. A lean budget of a hundredth of the device made the training ops crawl (the triangle
# multiplication's channel chunk leaves two pair shards aside: below that it ran 128 one-channel
# chunks, each re-reading z; a 2-block step at N=2,048 took 5.3 s compiled against 1.3 s, and eager
# four such steps did not finish in 110 s against 4.0 s each, on one H200; docs/perf_notes.md,
# "Where a training step's time goes"); a budget of a few pair shards is about what the op gets near the max N,
# where the normal budget is 40 % of a small room.
_LEAN_TRAINING_PAIRS = 4


def training_budget_bytes(pair: torch.Tensor) -> int:
    """The chunk budget of a checkpointed block in training (``block.op_runner``): the default
    budget measured after leaving room for that block's backward (``BACKWARD_PAIRS`` tensors
    the size of ``pair``), with the same size term as ``budget_bytes``, rounded down to one of
    ``_TRAINING_BUDGET_STEPS`` steps of that term. Without the room the budget is 40 % of a free
    memory that the backward then fills, and a step that fits in the forward fails in the
    backward (docs/perf_notes.md, "Training: memory and speed"). Lean (CUDA): ``_LEAN_TRAINING_PAIRS`` pair
    shards, at most the size term, or the lean term if larger. CPU: the default (a quarter of
    the pair shard). A plain int: it has a minimum of its own, so it never carries the
    ``rows_per_chunk`` floor."""
    if _override_bytes is not None or not pair.is_cuda:
        return budget_bytes(pair)
    free_b, capacity_b = _cuda_free_bytes(pair.device)
    pair_b = pair.numel() * pair.element_size()
    term_b = _cuda_size_term(pair_b, capacity_b)
    if _lean:
        lean_b = _cuda_size_term(pair_b, capacity_b, _LEAN_PAIR_FRACTION, _LEAN_DEVICE_FRACTION)
        return max(lean_b, min(_LEAN_TRAINING_PAIRS * pair_b, term_b))
    room_b = free_b - BACKWARD_PAIRS * pair_b
    budget_b = min(int(room_b * _CUDA_FREE_FRACTION), term_b)
    step_b = term_b // _TRAINING_BUDGET_STEPS
    budget_b = budget_b // step_b * step_b if budget_b >= step_b else pow2_floor(max(budget_b, 0))
    return max(budget_b, _MIN_TRAINING_BUDGET_BYTES)


def _rows_fit(n_rows: int, bytes_per_row: int, budget_b: int) -> int:
    return max(1, min(n_rows, int(budget_b) // max(1, bytes_per_row)))


def rows_per_chunk(n_rows: int, bytes_per_row: int, budget_b: int) -> int:
    """How many rows of ``bytes_per_row`` transient bytes fit ``budget_b`` (at least 1).

    Under a ``FreeMemoryBudget`` (CUDA) a chunk smaller than all ``n_rows`` is rounded down to a
    power of two. The compiled passes (``kernels=flex``) compile once per shape, and free-memory
    budgets differ by a few MiB from op to op, so exact row counts made a new shape at nearly every
    call near the limit: on one H200, each triangle multiplication of the default job's probe step
    at N=16,384 compiled afresh, about 11 s of its 22 s (docs/perf_notes.md, "Near the memory
    limit"). Powers of two keep a handful of shapes, at most twice the chunks, never more
    memory. Plain budgets (CPU, lean and overridden ones: fixed sizes, smooth in N, which the
    probe's peak fit relies on) keep exact counts.

    Raises:
        ChunkBudgetFloor: ``budget_b`` is a ``FreeMemoryBudget`` that holds fewer than
            ``min(n_rows, MIN_ROWS_PER_CHUNK)`` rows (out of memory at this N).
    """
    if not clears_floor(n_rows, bytes_per_row, budget_b):
        mib = float(1 << 20)
        raise ChunkBudgetFloor(
            f"chunk budget floor: {_caller()} needs {bytes_per_row / mib:.1f} MiB per row "
            f"(at least {min(n_rows, MIN_ROWS_PER_CHUNK)} of {n_rows} rows per chunk), budget "
            f"{budget_b / mib:.1f} MiB of free memory: out of memory at this N")
    fit = _rows_fit(n_rows, bytes_per_row, budget_b)
    return fit if fit >= n_rows or not isinstance(budget_b, FreeMemoryBudget) else pow2_floor(fit)


def pow2_floor(n: int) -> int:
    """The largest power of two <= ``n`` (0 for 0)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 0


def clears_floor(n_rows: int, bytes_per_row: int, budget_b: int) -> bool:
    """Whether ``rows_per_chunk(n_rows, bytes_per_row, budget_b)`` returns rather than raising
    ``ChunkBudgetFloor`` (always, for a plain-int budget)."""
    return not (isinstance(budget_b, FreeMemoryBudget) and budget_b < bytes_per_row * min(n_rows, MIN_ROWS_PER_CHUNK))


def _caller() -> str:
    """``module.function`` of the op that asked ``rows_per_chunk`` (for the floor's message)."""
    frame = sys._getframe(2)
    return f"{frame.f_globals.get('__name__', '?').rsplit('.', 1)[-1]}.{frame.f_code.co_name}"


def slices(n: int, size: int) -> Iterator[slice]:
    """``[0, n)`` in consecutive slices of ``size``."""
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def divisor_chunk(n: int, bytes_per_unit: int, budget_b: int) -> int:
    """The largest divisor of ``n`` whose ``bytes_per_unit`` multiples fit ``budget_b`` (>= 1);
    used for channel chunks, which should split the channels evenly.

    No floor: at most ``n`` chunks (the channels, a model width, not N), so it cannot crawl as
    N grows, and callers pass what is left of a budget (``max(budget - 2 * pair, 0)``), which
    is legitimately zero near the limit in training."""
    fit = _rows_fit(n, bytes_per_unit, budget_b)
    return max(d for d in range(1, fit + 1) if n % d == 0)


def scratch_channel_chunks(c: int, ck_budget: int, ck_scratch_max: int) -> list[tuple[slice, bool]]:
    """Channel chunks of an op that fills a ``[c, ...]`` output chunk by chunk and needs two
    operand chunks of the same shape per chunk (the lean triangle multiplication): ``(channels,
    in_scratch)`` in order. While the output's unfilled channels hold three chunks, a chunk's two
    operands live in them (``in_scratch``: channels ``cs.stop .. cs.stop + 2·len(cs)``, no
    allocation) and the chunk is the largest power of two that fits a third of them, capped at
    ``ck_scratch_max``; where that is no larger than ``ck_budget`` (what the free memory holds)
    the rest goes in ``ck_budget`` chunks with operands allocated as before. Near the memory limit
    ``ck_budget`` is 1–2 channels, and each chunk re-reads the whole input: 128 channels took 64
    chunks at 2, and take 12 with this schedule.

    Example: ``scratch_channel_chunks(128, 2, 128)`` -> chunks of 32, 32, 16, 16, 8, 8, 4, 4
    (operands in scratch), then 2, 2, 2, 2, 2, 2, 2, 2, 2, 2.
    """
    chunks, done = [], 0
    while done < c:
        third = min((c - done) // 3, ck_scratch_max)
        ck = pow2_floor(third)
        in_scratch = ck > ck_budget
        ck = ck if in_scratch else min(ck_budget, c - done)
        chunks.append((slice(done, done + ck), in_scratch))
        done += ck
    return chunks
