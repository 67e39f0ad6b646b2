"""The communication model: what a step's collectives would cost on a named interconnect.

A step's collectives are counted per kind by the trunk (``stats.comm_step``, ``comm_per_block``:
``{kind: {"calls": c, "bytes": b}}``, the bytes this rank sends, ``models/pairformer/parallel/comm.py``).
With nccl-tests' bus bandwidth, a call that sends ``b`` bytes takes ``b / busbw`` for every kind
(all-gather sends ``(P-1)·|x|`` and moves ``P·|x|`` at ``algbw = busbw·P/(P-1)``; likewise for
reduce-scatter, all-reduce, all-to-all), plus a latency per call. Bus bandwidth depends on the
message size: a link names a few (bytes per call, GB/s) points per kind and a call in between
interpolates linearly in log-size (outside, the nearest point).

The predicted step time is a range (``StepRange``): compute + communication when nothing
overlaps, max(compute, communication) when everything does. Analytical models of this kind are
typically 10-20 % off a real run until calibrated on the node (``python -m cpbench.link``).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "p2p")


class LinkError(ValueError):
    """A link config or calibration file that cannot be used: ``key=value: what is allowed``."""


@dataclass(frozen=True)
class Link:
    """An interconnect: bus bandwidth per collective kind over message size, latency per call.

    Attributes:
        name: the preset (``link=h200_nvlink``) or ``measured``.
        source: where the figures come from (one line, recorded with every prediction).
        latency_us: seconds per call, in microseconds.
        busbw_gbps: ``{kind: ((bytes per call, GB/s), ...)}`` sorted by size.
    """

    name: str
    source: str
    latency_us: float
    busbw_gbps: Mapping[str, tuple[tuple[int, float], ...]]

    def busbw(self, kind: str, bytes_per_call: float) -> float:
        """GB/s of one call of ``kind`` sending ``bytes_per_call`` (log-size interpolation)."""
        points = self.busbw_gbps.get(kind) or self.busbw_gbps.get("all_to_all")
        if not points:
            raise LinkError(f"link.busbw_gbps.{kind}: missing (a {{bytes per call: GB/s}} table per collective kind)")
        sizes = [s for s, _ in points]
        i = bisect.bisect_left(sizes, bytes_per_call)
        if i == 0:
            return points[0][1]
        if i == len(points):
            return points[-1][1]
        (s0, b0), (s1, b1) = points[i - 1], points[i]
        w = (math.log(bytes_per_call) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return b0 + w * (b1 - b0)

    def comm_ms(self, counts: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """Milliseconds per collective kind for ``counts`` (``{kind: {"calls", "bytes"}}``)."""
        out = {}
        for kind, c in counts.items():
            calls, sent_b = float(c.get("calls") or 0), float(c.get("bytes") or 0)
            if calls <= 0:
                continue
            per_call_b = max(sent_b / calls, 1.0)
            out[kind] = calls * self.latency_us * 1e-3 + sent_b / (self.busbw(kind, per_call_b) * 1e9) * 1e3
        return out

    def record(self) -> dict:
        return {"name": self.name, "source": self.source, "latency_us": self.latency_us}


@dataclass(frozen=True)
class StepRange:
    """A step's predicted time (ms): compute + communication (no overlap) down to their max."""

    compute_ms: float
    comm_ms: float

    @property
    def no_overlap_ms(self) -> float:
        return self.compute_ms + self.comm_ms

    @property
    def full_overlap_ms(self) -> float:
        return max(self.compute_ms, self.comm_ms)

    @property
    def dominant(self) -> str:
        return "communication" if self.comm_ms > self.compute_ms else "compute"

    def record(self) -> dict:
        return {"compute_ms": round(self.compute_ms, 3), "comm_ms": round(self.comm_ms, 3),
                "step_ms_range": [round(self.full_overlap_ms, 3), round(self.no_overlap_ms, 3)],
                "dominant": self.dominant}


def _table(kind: str, raw: Any) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, Mapping) or not raw:
        raise LinkError(f"link.busbw_gbps.{kind}={raw}: a {{bytes per call: GB/s}} table")
    try:
        points = sorted((int(size), float(gbps)) for size, gbps in raw.items())
    except (TypeError, ValueError):
        raise LinkError(f"link.busbw_gbps.{kind}={dict(raw)}: sizes in bytes, bandwidths in GB/s") from None
    if any(size <= 0 or gbps <= 0 for size, gbps in points):
        raise LinkError(f"link.busbw_gbps.{kind}={dict(raw)}: positive sizes and bandwidths")
    return tuple(points)


def link_from_config(node: Mapping[str, Any]) -> Link:
    """The ``link`` config node as a ``Link``: a preset's figures, or ``link=measured`` with
    ``link.file`` (the JSON ``python -m cpbench.link`` writes). Raises ``LinkError`` (one line)."""
    node = dict(node or {})
    if node.get("file") not in (None, "???"):
        path = Path(str(node["file"])).expanduser()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LinkError(f"link.file={path}: a calibration file of python -m cpbench.link ({exc})") from None
        node = {**data, "name": node.get("name", "measured"), "source": data.get("source") or f"measured: {path}"}
    elif node.get("name") == "measured":
        raise LinkError("link.file=???: link=measured needs link.file=FILE (written by python -m cpbench.link)")
    tables = node.get("busbw_gbps")
    if not isinstance(tables, Mapping):
        raise LinkError(f"link.busbw_gbps={tables}: a table per collective kind ({', '.join(KINDS)})")
    unknown = sorted(set(tables) - set(KINDS))
    if unknown:
        raise LinkError(f"link.busbw_gbps.{unknown[0]}: one of {', '.join(KINDS)}")
    latency = node.get("latency_us")
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise LinkError(f"link.latency_us={latency}: microseconds >= 0")
    return Link(str(node.get("name") or "link"), " ".join(str(node.get("source") or "").split()), float(latency),
                {kind: _table(kind, raw) for kind, raw in tables.items()})


def predict(link: Link, counts: Mapping[str, Mapping[str, float]], compute_ms: float) -> dict:
    """The ``comm_model`` block of a result record: the link, ms per kind, and the step range."""
    per_kind = link.comm_ms(counts)
    step = StepRange(compute_ms, sum(per_kind.values()))
    return {"link": link.record(), "comm_ms_per_kind": {k: round(v, 3) for k, v in per_kind.items()}, **step.record()}
