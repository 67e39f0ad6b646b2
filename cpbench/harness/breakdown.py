"""What one rank keeps at the peak of a step (``memory.breakdown=true``): by owner and by code line.

One more step, untimed, after a timing's repeats, under ``torch.profiler`` with memory events and
Python stacks. Every allocation and free of the step's device is replayed in time order; at the
moment the bytes allocated since the step began are highest (the step's peak), the live blocks
are grouped by where they were allocated:

* **held before the step**: what was live when the step began, split by owner where the
  objects say so (``parameters``, ``gradients``, ``optimizer_state`` of any
  ``torch.optim.Optimizer`` on the model or the adapter, ``inputs``: the batch's tensors), and on
  CUDA ``other_held`` (the allocator's count at the step's start less those: caches, CUDA-graph
  pools, buffers a model keeps between steps); a block freed before the peak leaves its owner.
* **allocated in the step**, by site: the innermost function of the model's own code above the
  allocation (``path function``; the profiler's Python events name a function, not the line
  inside it), skipping PyTorch, Triton, inductor's generated code, the standard library and the
  harness, so a compiled region is charged to the function that called it; an allocation with no
  such frame (autograd's backward thread) to its backward node (``backward: MmBackward0``), else
  to the op (``aten::empty``).

A free the profiler did not record (it follows the step's thread and autograd's, not gloo's
workers or NCCL's watchdog, which free what a collective's work held last) would leave a block
live for ever in the replay: such blocks are found (their address allocated again, or no tensor
alive after the step at it) and left out, their bytes in ``unseen_frees_gib``
(``seen_frees_only``).

Sizes are what the allocator was asked for (the profiler's ``alloc_size``): on CUDA the
allocator's ``max_memory_allocated`` over the same step is recorded beside it
(``allocator_peak_gib``) as the check that the replay found the peak; on a CPU there is no such
count (the timing's peak there is the resident set), so only the replay's figure stands.

Result (``memory_breakdown`` of the rank's outcome; GiB)::

    {"peak_gib": .., "held_gib": {"parameters": .., ...}, "step_gib": .., "sites": [
        {"site": "cpbench/models/pairformer/ops/triangle.py forward", "gib": .., "blocks": ..}, ...],
     "other_sites_gib": .., "unseen_frees_gib": .., "allocator_peak_gib": .. (CUDA), "events": ..}
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

GIB = float(1 << 30)
TOP_SITES = 12  # sites listed by size; the rest add up in other_sites_gib
# Frames that are not the model's own code: a site is the innermost frame outside these.
_LIBRARY = re.compile(r"(^|/)(torch|triton|torchgen|functorch|typing_extensions|contextlib|functools|"
                      r"threading|abc|runpy|_weakrefset)(/|\.py)|torchinductor|<frozen |<string>|"
                      r"cpbench/harness/")
_FRAME = re.compile(r"^(?P<path>.*)\((?P<line>\d+)\): (?P<func>.*)$")
_BACKWARD = "autograd::engine::evaluate_function: "


@dataclass(frozen=True)
class Alloc:
    """One allocation (``size > 0``) or free (``size < 0``) of the step's device, in time order."""

    time_ns: int
    ptr: int
    size: int
    site: str


def short_path(path: str) -> str:
    """A frame's file without its install prefix: from the package directory on
    (``.../site-packages/boltz/x.py`` -> ``boltz/x.py``; ``/work/cpbench/cpbench/a.py`` ->
    ``cpbench/a.py``)."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    for package in ("cpbench/", "boltz/", "openfold3/", "protenix/"):
        if package in path:
            return package + path.rsplit(package, 1)[1]
    return "/".join(path.split("/")[-2:])


_Context = tuple  # (site resolved so far or None, innermost op name or None)


@functools.lru_cache(maxsize=1 << 16)
def _frame_site(name: str) -> str | None:
    """``path function`` of a Python frame (``path(line): function``) of the model's own code, else None."""
    match = _FRAME.match(name)
    return f"{short_path(match['path'])} {match['func']}" if match and not _LIBRARY.search(match["path"]) else None


def _enter(context: _Context, kind: str, name: str) -> _Context:
    """The context inside an enclosing event, from the context around it: an inner frame of the
    model's code or an inner backward node overrides what encloses it; another op only names
    itself as the fallback."""
    if kind == "op":
        if name.startswith(_BACKWARD):
            return "backward: " + name[len(_BACKWARD):], None
        return context[0], name
    site = _frame_site(name)
    return (site, None) if site else context


def _site(context: _Context) -> str:
    return context[0] or context[1] or "(no frame)"


def site_of(frames: Iterable[tuple[str, str]]) -> str:
    """The site of an allocation from its enclosing events, innermost first, each ``(kind, name)``
    with kind ``py`` (a Python frame, ``path(line): function``) or ``op`` (a torch op)."""
    context: _Context = (None, None)
    for kind, name in reversed(list(frames)):
        context = _enter(context, kind, name)
    return _site(context)


def allocations(prof: torch.profiler.profile, device: torch.device) -> list[Alloc]:
    """The step's allocations and frees on ``device``, in time order, each with its site (one
    walk down the event tree, each event's context passed to its children)."""
    from torch._C._profiler import _EventType

    kinds = {_EventType.PyCall: "py", _EventType.TorchOp: "op"}
    found: list[Alloc] = []
    stack = [(node, (None, None)) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, context = stack.pop()
        tag = node.tag
        if tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == device.type and (device.index is None or fields.device.index == device.index):
                found.append(Alloc(node.start_time_ns, int(fields.ptr), int(fields.alloc_size), _site(context)))
            continue
        if tag in kinds:
            context = _enter(context, kinds[tag], node.name)
        stack.extend((child, context) for child in node.children)
    found.sort(key=lambda a: a.time_ns)
    return found


def tensors_of(obj: Any) -> Iterable[torch.Tensor]:
    """Every tensor in ``obj``: a batch as the adapters build one (a tensor, or dicts, lists,
    tuples and dataclasses of them, nested)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from tensors_of(getattr(obj, f.name))
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_of(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_of(value)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds); any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") and hasattr(t, "placements") else t


def optimizers(*owners: Any) -> list[torch.optim.Optimizer]:
    """The optimizers an adapter or its model holds as attributes (``model.optimizer``,
    ``adapter._optimizer``)."""
    found = []
    for owner in owners:
        for value in (vars(owner) if hasattr(owner, "__dict__") else {}).values():
            if isinstance(value, torch.optim.Optimizer) and all(value is not o for o in found):
                found.append(value)
    return found


def held_owners(model: Any, batch: Any, adapter: Any) -> dict[str, dict[int, int]]:
    """Per owner, the storages it holds now: ``{owner: {data_ptr: nbytes}}`` (each storage counted
    once, under its first owner in the order parameters, gradients, optimizer state, inputs)."""
    groups: dict[str, list[torch.Tensor]] = {"parameters": [], "gradients": [], "optimizer_state": [], "inputs": []}
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            groups["parameters"].append(_local(p.detach()))
            if p.grad is not None:
                groups["gradients"].append(_local(p.grad))
    for opt in optimizers(model, adapter):
        for state in opt.state.values():
            groups["optimizer_state"].extend(_local(t) for t in tensors_of(state))
    groups["inputs"].extend(_local(t) for t in tensors_of(batch))
    seen: set[int] = set()
    out: dict[str, dict[int, int]] = {}
    for owner, tensors in groups.items():
        out[owner] = {}
        for t in tensors:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr and ptr not in seen:
                seen.add(ptr)
                out[owner][ptr] = storage.nbytes()
    return out


def seen_frees_only(events: list[Alloc], alive_after: set[int] | None) -> tuple[list[Alloc], int]:
    """``events`` less the blocks whose free the profiler did not record, and their bytes.

    The profiler records a free only on a thread it follows (the step's own and autograd's):
    a block whose last reference a collective's work held is freed on the backend's thread
    (gloo's workers, NCCL's watchdog) when the work ends, and no event says so (a real gloo
    step at cp=2 in the CPU tests: tens of MiB, from all-gathered chunks to the 8-byte tensors
    that agree on a chunk size). Such a block shows itself when its address is allocated again
    with no free in between, or when no tensor alive after the step (``alive_after``: storage
    addresses; None: not known) starts at it. It is left out of the replay whole: it lived for
    its collective, and the step had let it go. Emulated runs have none (the fake group holds
    nothing), nor has cp=1."""
    unseen: set[int] = set()
    last_alloc: dict[int, int] = {}
    for i, event in enumerate(events):
        if event.size > 0:
            if event.ptr in last_alloc:
                unseen.add(last_alloc[event.ptr])
            last_alloc[event.ptr] = i
        else:
            last_alloc.pop(event.ptr, None)
    if alive_after is not None:
        unseen.update(i for ptr, i in last_alloc.items() if ptr not in alive_after)
    return [e for i, e in enumerate(events) if i not in unseen], sum(events[i].size for i in unseen)


def alive_storages() -> set[int]:
    """Addresses of every storage a live Python tensor holds now. A DTensor's local shard is a
    tensor object of its own, so the walk meets it; the DTensor wrapper has no storage."""
    import gc

    found = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and not obj.is_meta:  # not isinstance: no __class__ hook runs
            try:
                found.add(obj.untyped_storage().data_ptr())
            except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass)
                pass
    return found


def replay(events: list[Alloc], held: dict[str, dict[int, int]], other_held_b: int | None,
           alive_after: set[int] | None = None) -> dict:
    """The breakdown at the peak of ``events`` (see the module docstring); ``held`` the owners'
    storages at the step's start, ``other_held_b`` the rest of what was live then (None: unknown)."""
    owner_of = {ptr: owner for owner, ptrs in held.items() for ptr in ptrs}
    recorded = len(events)
    events, unseen_b = seen_frees_only(events, alive_after)
    live: dict[int, Alloc] = {}
    net = peak = 0
    peak_at = -1
    for i, event in enumerate(events):
        net += event.size
        if event.size > 0:
            live[event.ptr] = event
        else:
            live.pop(event.ptr, None)
        if net > peak:
            peak, peak_at = net, i
    # the state at the peak: replay again up to it (the first pass kept no copies)
    live, freed_held = {}, {owner: 0 for owner in held}
    freed_other = 0
    for event in events[:peak_at + 1]:
        if event.size > 0:
            live[event.ptr] = event
        elif live.pop(event.ptr, None) is None:  # a block that was live before the step
            if event.ptr in owner_of:
                freed_held[owner_of[event.ptr]] += -event.size
            else:
                freed_other += -event.size
    held_gib = {owner: max(0, sum(ptrs.values()) - freed_held[owner]) / GIB for owner, ptrs in held.items()}
    if other_held_b is not None:
        held_gib["other_held"] = max(0, other_held_b - freed_other) / GIB
    by_site: dict[str, list[int]] = {}
    for event in live.values():
        entry = by_site.setdefault(event.site, [0, 0])
        entry[0] += event.size
        entry[1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: -kv[1][0])
    step_b = sum(size for size, _ in by_site.values())
    return {"peak_gib": sum(held_gib.values()) + step_b / GIB,
            "held_gib": {k: round(v, 9) for k, v in held_gib.items()},
            "step_gib": round(step_b / GIB, 9),
            "sites": [{"site": site, "gib": round(size / GIB, 9), "blocks": n} for site, (size, n) in ranked[:TOP_SITES]],
            "other_sites_gib": round(sum(size for _, (size, _) in ranked[TOP_SITES:]) / GIB, 9),
            "unseen_frees_gib": round(unseen_b / GIB, 9), "events": recorded}


def peak_breakdown(step: Callable[[], Any], device: torch.device, model: Any, batch: Any, adapter: Any,
                   sites: str = "function") -> dict:
    """Run ``step`` once under the profiler and return what this rank keeps at its peak.

    ``sites="function"`` records Python stacks so that a site is the model's function above the
    allocation; ``"op"`` records none (each site is then its op or backward node), which costs
    about half the profiled step on a CPU (a 2x2 training step at N=128: 55 s against 108 s for
    four gloo ranks on two cores), and leaves the peak and the owners as they are."""
    from torch.profiler import ProfilerActivity, profile

    held = held_owners(model, batch, adapter)
    other_held_b = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        other_held_b = max(0, torch.cuda.memory_allocated(device) - sum(sum(p.values()) for p in held.values()))
        torch.cuda.reset_peak_memory_stats(device)
        start_b = torch.cuda.memory_allocated(device)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=sites == "function") as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out = replay(allocations(prof, device), held, other_held_b, alive_storages())
    if device.type == "cuda":
        out["allocator_peak_gib"] = round(torch.cuda.max_memory_allocated(device) / GIB, 9)
        out["allocator_start_gib"] = round(start_b / GIB, 9)
    out["peak_gib"] = round(out["peak_gib"], 9)
    out["sites_by"] = sites
    return out
