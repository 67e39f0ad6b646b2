"""The README's walltime list: how long one step takes, per measured point, beside the max N.

``walltime_lines`` owns the figures: for each timing point of a whole model (a ``model.blocks``
slice is not a step of the model; ``[model.msa_blocks=0]``, a trunk-only pass, is) the median of
its latest ok run, on the fastest backend measured there, with the ``torch`` path's median and
the speed-up beside it where both ran. A compiled training point (``model
[model.compile_training=true]``) is the same step as the model's ``torch`` one: the backend
names it (``rows.without_training_path``). ``walltime_block`` writes them as the list that
``python -m cpbench.report DIR --readme README.md`` puts between the README's walltime markers
(beside the max-N headline's), so the README's step times, like its max N, come from the report.
"""

from __future__ import annotations

import pandas as pd

from cpbench.report.analysis import TIMING_POINT, latest_ok_timing
from cpbench.report.rows import day_of, without_training_path

WALLTIME_START = "<!-- walltime:start -->"
WALLTIME_END = "<!-- walltime:end -->"
DEPTH_SLICE = "model.blocks="  # a label with it times a slice of the trunk, not the model's step


def walltime_lines(rows: pd.DataFrame) -> list[str]:
    """One line per whole-model timing point (model, workflow, CP config, N), e.g.
    ``- boltz2 training, 1d cp=1, N=1,536: 20,811 ms (flex; 2026-12-02; torch 60,416 ms, 2.90×)``
    (the backend and the date of the figure, the ``torch`` one beside it, with its own date where
    it was measured on another day: that ratio was not taken side by side)."""
    latest = latest_ok_timing(rows)
    if latest.empty:
        return []
    latest = latest[latest["model"].map(lambda m: isinstance(m, str) and DEPTH_SLICE not in m)].copy()
    latest["model"] = latest["model"].map(without_training_path)
    latest["kernels"] = latest["kernels"].fillna("") if "kernels" in latest else ""
    lines = []
    for (model, workflow, cp_config, n), point in latest.groupby(TIMING_POINT, sort=False):
        torch_rows = point[point["kernels"] == "torch"]
        best = point.loc[point["walltime (ms)"].idxmin()]
        best_day = day_of(best.get("date"))
        detail = [t for t in (best["kernels"], best_day) if t]
        if best["kernels"] != "torch" and not torch_rows.empty:
            ref = torch_rows.loc[torch_rows["walltime (ms)"].idxmin()]
            ref_day = day_of(ref.get("date"))
            when = f" on {ref_day}" if ref_day and ref_day != best_day else ""  # not side by side: say so
            detail.append(f"torch {ref['walltime (ms)']:,.0f} ms{when}, {ref['walltime (ms)'] / best['walltime (ms)']:.2f}×")
        lines.append((model, workflow, _cp_order(cp_config), int(n),
                      f"- {model} {workflow}, {cp_config}, N={int(n):,}: {best['walltime (ms)']:,.0f} ms"
                      + (f" ({'; '.join(detail)})" if detail else "")))
    return [line for *_, line in sorted(lines)]


def walltime_block(lines: list[str], context: str) -> str:
    """The README's walltime list under a lead line naming ``context`` (device, dates, dtype)."""
    lead = (f"Walltime of one step measured {context}: the median of the latest run of each point, on the "
            "fastest kernel backend measured there, with the `torch` path beside it where both ran "
            "(written by `python -m cpbench.report --readme`):")
    return "\n".join([lead, "", *(lines or ["- no timing point was measured"])])


def _cp_order(cp_config: str) -> tuple[int, str]:
    """``1d cp=2`` -> ``(2, "1d cp=2")``: lines go by CP size, then topology."""
    size = cp_config.rsplit("cp=", 1)[-1]
    return (int(size) if size.isdigit() else 0, cp_config)
