"""CUDA-graph replay (``model.cuda_graphs=true``), inference at cp=1: the trunk's Pairformer blocks
(``GraphedBlocks``) and the sampler's denoiser call (``GraphedDenoiser``).

Why: at small N a pass is host-bound. At N=512 on one H200 the ``flex`` blocks' kernels leave the
GPU idle while the host launches the next ones (a 4.6 ms block once the free-memory readings were
cut, ``docs/perf_notes.md``, "The 64-block pass"), so the 64-block pass moves with the
host's speed from run to run (312-675 ms); the sampler's 200 denoiser calls per step (24 token
blocks, and the atom transformer sample by sample) launch many small kernels each. Captured once
and replayed, a pass or a call costs the GPU's time only: the host launches one graph.

When a graph replays (otherwise the work runs eagerly, exactly as without the switch):

* on CUDA, without autograd, at one rank (cp=1; a capture under CP would hold NCCL collectives,
  which no two-GPU machine has been lent to measure);
* when the chunk budget is the ample device term (``chunking.ample_budget`` of the pair): not near
  the limit, not the probe's lean fitting points, no override. The capture runs under that budget,
  frozen (``block.under_budget``), so its chunks are those the eager ops choose and nothing inside
  the capture reads free memory or waits on the host;
* after the same work ran once eagerly (it compiles the ``flex`` path, so no compilation, with
  its host syncs, happens inside a capture): the trunk's blocks from the second pass of one shape
  in the process on (captured once, replayed by every later step); the denoiser from the second
  call of each sampling run on (captured in every step: its conditioning is that step's).

Memory: a replay allocates nothing; its live tensors are the capture's, at the same addresses, so
the capture's peak allocated is a replay's peak (``peak_b``; the trunk hands it to its stage
timer, since the blocks' capture ran in an earlier step). A graph's pool stays reserved while the
graph lives; before the trunk's capture the eager blocks' cached memory is released
(``torch.cuda.empty_cache``) so the reserved memory counts the blocks' working set once.

A capture that fails (an op that syncs the host, say) leaves that work eager, says why in
``state`` (the adapter's ``stats.cuda_graphs``) and does not stop the step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import torch

from cpbench.models.pairformer.modules.block import under_budget
from cpbench.models.pairformer.parallel import chunking
from cpbench.models.pairformer.parallel.layout import Layout

Pair = tuple[torch.Tensor, torch.Tensor]


class CudaGraph:
    """One ``torch.cuda.CUDAGraph``: ``capture(fn)`` records ``fn()`` without running it and
    returns its outputs (static tensors of the graph's pool); ``replay()`` runs it on the current
    stream.

    The capture runs on a side stream (one per process: captures never overlap) after the caller
    synchronised the device, as ``torch.cuda.graph`` does, but without its ``empty_cache``: the
    denoiser captures once per sampling run, and emptying the cache every step would make the
    next step's allocations go back to ``cudaMalloc``. ``thread_local`` error mode: only this
    thread's unsafe calls void the capture; the NCCL process group's watchdog thread (a one-rank
    run has one too) queries its events at any time."""

    _stream: torch.cuda.Stream | None = None

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], Any]) -> Any:
        if CudaGraph._stream is None:
            CudaGraph._stream = torch.cuda.Stream()
        with torch.cuda.stream(CudaGraph._stream):
            self.graph.capture_begin(capture_error_mode="thread_local")
            try:
                outputs = fn()
            except BaseException:
                try:  # end the voided capture; the error that voided it is the one to report
                    self.graph.capture_end()
                except RuntimeError:
                    pass
                raise
            self.graph.capture_end()
        return outputs

    def replay(self) -> None:
        self.graph.replay()


class CaptureFailed(RuntimeError):
    """A capture that did not complete; its message is the first line of the error that voided it."""


def capture(graph_factory: Callable[[], CudaGraph], fn: Callable[[], Any], budget_b: int,
            like: torch.Tensor, release_cache: bool = False) -> tuple[CudaGraph, Any, float, int]:
    """Record ``fn()`` into a new graph under the frozen chunk budget ``budget_b``.

    Returns ``(graph, outputs, seconds, peak_b)``: the graph, ``fn``'s outputs (static tensors of its
    pool), the wall seconds the capture took, and the peak allocated bytes since the caller's last
    peak reset (CUDA; 0 on a CPU). The device is synchronised first (the capture stream then
    follows everything queued); ``release_cache`` also empties the allocator's cache.
    Raises ``CaptureFailed`` with the error's first line."""
    start_s = time.perf_counter()
    if like.is_cuda:
        torch.cuda.synchronize(like.device)
        if release_cache:
            torch.cuda.empty_cache()
    graph = graph_factory()
    try:
        with under_budget(budget_b):
            outputs = graph.capture(fn)
    except RuntimeError as exc:
        text = str(exc).strip()
        raise CaptureFailed(text.splitlines()[0] if text else type(exc).__name__) from exc
    finally:
        if like.is_cuda:
            torch.cuda.synchronize(like.device)
    peak_b = torch.cuda.max_memory_allocated(like.device) if like.is_cuda else 0
    return graph, outputs, time.perf_counter() - start_s, peak_b


class _Graphs:
    """What both kinds share: where graphs apply, the capture clock, the last run's state."""

    def __init__(self, graph_factory: Callable[[], CudaGraph] = CudaGraph) -> None:
        self._graph_factory = graph_factory
        self.capture_s = 0.0  # wall seconds spent capturing, in this process
        self.state = "eager"  # the last pass or sampling run: "replay", "eager" or "capture failed: ..."
        self.peak_b = 0  # the last replay's peak allocated bytes (its capture's), else 0

    def applies(self, like: torch.Tensor) -> bool:
        """Whether graphs can apply to tensors like ``like`` at all: on CUDA, without autograd."""
        return like.is_cuda and not torch.is_grad_enabled()

    def budget(self, z: torch.Tensor, layout: Layout) -> int:
        """The chunk budget a capture over the pair (shard) ``z`` runs under; 0: run eagerly."""
        if not self.applies(z) or layout.sharded:
            return 0
        return chunking.ample_budget(z)

    def _capture(self, fn: Callable[[], Any], budget_b: int, like: torch.Tensor,
                 release_cache: bool = False) -> tuple[CudaGraph, Any, int] | None:
        """``(graph, outputs, peak_b)``, or None after a failed capture (``state`` says why)."""
        try:
            graph, outputs, seconds, peak_b = capture(self._graph_factory, fn, budget_b, like, release_cache)
        except CaptureFailed as exc:
            self.state = f"capture failed: {exc}"
            return None
        self.capture_s += seconds
        return graph, outputs, peak_b


@dataclasses.dataclass
class Entry:
    """A captured block loop: its graph, static inputs (``s``, token mask) and outputs, and the
    peak allocated bytes a replay holds (the capture's)."""

    graph: CudaGraph
    static_s: torch.Tensor
    static_mask: torch.Tensor
    out_s: torch.Tensor
    out_z: torch.Tensor
    peak_b: int


class GraphedBlocks(_Graphs):
    """The trunk's block loop as a replayed CUDA graph where it applies (module docstring).

    ``run(loop, blocks, s, z, token_mask, layout)`` returns ``(s, z)`` from a replay, or None where
    the caller runs the blocks eagerly. ``loop(blocks, s, z, token_mask, layout) -> (s, z)`` is the
    trunk's eager block loop, captured as it is. Per key (blocks run, the shapes of ``s`` and
    ``z``, dtype, budget, the pair buffer): one graph with its pool and static inputs. ``z`` is
    not copied in: the trunk writes each forward's pair into the buffer it got from
    ``pair_buffer``, the one the graph captured (the blocks update it in place; at cp=1 their
    transposes are views), and copies only ``s`` and the token mask (O(N)) into the graph's
    inputs. ``graph_factory`` makes a graph (tests pass one that runs on a CPU).
    """

    def __init__(self, graph_factory: Callable[[], CudaGraph] = CudaGraph) -> None:
        super().__init__(graph_factory)
        self._entries: dict[tuple, Entry] = {}
        self._eager_once: set[tuple] = set()
        self._failed: dict[tuple, str] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}

    def pair_buffer(self, shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed pair tensor ``[N/P, N, c_z]`` on ``like``'s device, the same storage at every
        forward of one shape (the graph's captured ``z``); new where graphs cannot apply."""
        if not self.applies(like):
            return like.new_zeros(shape, dtype=dtype)
        key = (tuple(shape), dtype, like.device)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = like.new_zeros(shape, dtype=dtype)
        return buffer.zero_()

    def run(self, loop: Callable[..., Pair], blocks, s: torch.Tensor, z: torch.Tensor,
            token_mask: torch.Tensor, layout: Layout) -> Pair | None:
        """Args: ``s: [N/P, c_s]``, ``z: [N/P, N, c_z]``, ``token_mask: [N]``.
        Returns: ``(s, z)`` after ``blocks``, from a replay (``s`` a fresh tensor, ``z`` a view of
        the same storage as the ``z`` passed in), or None: run the blocks eagerly."""
        self.state, self.peak_b = "eager", 0
        budget_b = self.budget(z, layout)
        if not budget_b:
            return None
        key = (len(blocks), tuple(s.shape), tuple(z.shape), z.dtype, int(budget_b), z.data_ptr())
        if key in self._failed:
            self.state = self._failed[key]
            return None
        entry = self._entries.get(key)
        if entry is None:
            if key not in self._eager_once:  # compiles and warms up outside any capture
                self._eager_once.add(key)
                return None
            entry = self._capture_blocks(key, loop, blocks, s, z, token_mask, layout, budget_b)
            if entry is None:
                return None
        entry.static_s.copy_(s)
        entry.static_mask.copy_(token_mask)
        entry.graph.replay()
        self.state, self.peak_b = "replay", entry.peak_b
        return entry.out_s.clone(), entry.out_z

    def _capture_blocks(self, key: tuple, loop: Callable[..., Pair], blocks, s: torch.Tensor, z: torch.Tensor,
                        token_mask: torch.Tensor, layout: Layout, budget_b: int) -> Entry | None:
        static_s, static_mask = s.clone(), token_mask.clone()
        captured = self._capture(lambda: loop(blocks, static_s, z, static_mask, layout), budget_b, z,
                                 release_cache=True)
        if captured is None:
            self._failed[key] = self.state
            return None
        graph, (out_s, out_z), peak_b = captured
        entry = self._entries[key] = Entry(graph, static_s, static_mask, out_s, out_z, peak_b)
        return entry


class GraphedDenoiser(_Graphs):
    """The sampler's denoiser call ``denoise(x_noisy, t) -> x_denoised`` as a replayed CUDA graph
    within one sampling run (module docstring): ``wrap(denoise, z_hat, layout)`` returns the
    function the sampler calls. The first call runs eagerly, the second captures (static
    ``x_noisy: [S, A, 3]`` and ``t: [S]``, copied in at every call) and replays, every later
    call replays. The conditioning the denoiser reads (``DiffusionContext``) is that run's, so
    the graph lives as long as the function ``wrap`` returned: one capture per sampling run.
    ``graph_factory`` makes a graph (tests pass one that runs on a CPU)."""

    def __init__(self, graph_factory: Callable[[], CudaGraph] = CudaGraph) -> None:
        super().__init__(graph_factory)
        self._failed: str | None = None  # a failed capture: later runs stay eager

    def wrap(self, denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], z_hat: torch.Tensor,
             layout: Layout) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``denoise``, replayed from its second call on where graphs apply (``z_hat``: the pair
        conditioning ``[N/P, N, c_z]`` whose budget the capture freezes); ``denoise`` itself where
        they do not."""
        self.state, self.peak_b = self._failed or "eager", 0
        budget_b = self.budget(z_hat, layout)
        if not budget_b or self._failed:
            return denoise
        run: dict[str, Any] = {"calls": 0, "graph": None}

        def graphed(x_noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            run["calls"] += 1
            if run["graph"] is None:
                if run["calls"] == 1 or self._failed:  # the first call compiles, outside any capture
                    return denoise(x_noisy, t)
                static_x, static_t = x_noisy.clone(), t.clone()
                captured = self._capture(lambda: denoise(static_x, static_t), budget_b, z_hat)
                if captured is None:
                    self._failed = self.state
                    return denoise(x_noisy, t)
                graph, out, self.peak_b = captured
                run.update(graph=graph, x=static_x, t=static_t, out=out)
            run["x"].copy_(x_noisy)
            run["t"].copy_(t)
            run["graph"].replay()
            self.state = "replay"
            return run["out"].clone()

        return graphed
