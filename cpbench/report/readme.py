"""The README's results table, written by ``python -m cpbench.report DIR --readme README.md``.

One row per configuration (model, workflow, CP config) that has a max N or a whole-model step
time: its max N (``≥`` for a lower bound, what bounds it), the ratio to the stock Boltz-2 trunk's
single-GPU max N where the results hold one, the step time at the largest N timed (the median of
the latest run on the fastest kernel backend, the ``torch`` path beside it where both ran, dated
where it ran on another day: such a ratio was not taken side by side), and the command that made
the row (its result's own overrides). The table goes between the README's
``<!-- headline:start -->`` and ``<!-- headline:end -->`` markers (``replace_marked_block``), so
the README's figures come from the report, never typed by hand.

The table holds one hardware's figures: the GPU model with the most results (``primary_hardware``);
a line under it names the others, whose figures are in the report (a ratio across two GPU models
would not be a ratio of CP sizes or kernels). A ``model.blocks`` slice times part of the trunk,
not the model's step: its timings stay in the report, out of this table. A compiled training
point (``[model.compile_training=true]``) is the model's training step on another backend: the
backend names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cpbench.report.analysis import latest_ok_timing
from cpbench.report.headline import HeadlineRow
from cpbench.report.rows import HARDWARE, day_of, ensure_hardware, without_training_path

README_START = "<!-- headline:start -->"
README_END = "<!-- headline:end -->"
DEPTH_SLICE = "model.blocks="  # a label with it times a slice of the trunk, not the model's step
# What each workflow label means, said in the table: inference without sampling is the trunk alone.
WORKFLOW_TEXT = {"inference": "inference, trunk only", "inference+sampling": "inference with sampling",
                 "training": "training step"}
DASH = "—"


@dataclass
class StepTime:
    """The step time of a configuration at its largest timed N (see the module docstring)."""

    n: int
    ms: float
    kernels: str
    day: str
    torch_ms: float | None = None
    torch_day: str = ""
    command: str | None = None

    def text(self) -> str:
        detail = [t for t in (self.kernels, self.day) if t]
        if self.torch_ms is not None:
            when = f" on {self.torch_day}" if self.torch_day and self.torch_day != self.day else ""
            detail.append(f"torch {self.torch_ms:,.0f} ms{when}, {self.torch_ms / self.ms:.2f}×")
        return f"{self.ms:,.0f} ms at N={self.n:,}" + (f" ({'; '.join(detail)})" if detail else "")


@dataclass
class TableRow:
    hardware: str
    model: str
    workflow: str
    cp_config: str
    max_n: str = DASH
    vs_stock: str = DASH
    step: StepTime | None = None
    commands: list[str] = field(default_factory=list)


def step_times(rows: pd.DataFrame) -> dict[tuple[str, str, str, str], StepTime]:
    """``(hardware, model, workflow, CP config) -> StepTime`` at the largest N of its whole-model timings."""
    latest = latest_ok_timing(ensure_hardware(rows))
    if latest.empty:
        return {}
    latest = latest[latest["model"].map(lambda m: isinstance(m, str) and DEPTH_SLICE not in m)].copy()
    latest["model"] = latest["model"].map(without_training_path)
    latest["kernels"] = latest["kernels"].fillna("") if "kernels" in latest else ""
    out = {}
    for key, config in latest.groupby([HARDWARE, "model", "workflow", "CP config"], sort=False):
        at_n = config[config["N_tokens"] == config["N_tokens"].max()]
        best = at_n.loc[at_n["walltime (ms)"].idxmin()]
        step = StepTime(int(best["N_tokens"]), float(best["walltime (ms)"]), str(best["kernels"]),
                        day_of(best.get("date")), command=_command(best.get("command")))
        torch_rows = at_n[at_n["kernels"] == "torch"]
        if best["kernels"] != "torch" and not torch_rows.empty:
            ref = torch_rows.loc[torch_rows["walltime (ms)"].idxmin()]
            step.torch_ms, step.torch_day = float(ref["walltime (ms)"]), day_of(ref.get("date"))
        out[tuple(str(k) for k in key)] = step
    return out


def table_rows(headline: list[HeadlineRow], rows: pd.DataFrame) -> list[TableRow]:
    """The table's rows: every headline configuration with its step time, then the timed
    configurations without a max N."""
    steps = step_times(rows)
    out, used = [], set()
    for h in headline:
        key = (h.hardware, without_training_path(h.model), h.workflow, h.cp_config)
        step = steps.get(key)
        used.add(key)
        vs_stock = h.ratio_text() if (h.baseline_name or "").startswith("the stock ") else None
        out.append(TableRow(h.hardware, h.model, h.workflow, h.cp_config,
                            f"{h.max_n_text()}" + (f" ({h.note})" if h.note else ""),
                            vs_stock.split("× ", 1)[0] + "×" if vs_stock else DASH, step,
                            [c for c in (_command(h.command), step.command if step else None) if c]))
    for key, step in steps.items():
        if key not in used:
            out.append(TableRow(*key, step=step, commands=[step.command] if step.command else []))
    return sorted(out, key=lambda r: (r.hardware, r.model, r.workflow, _cp_order(r.cp_config)))


def primary_hardware(rows: pd.DataFrame) -> str | None:
    """The hardware the README's table shows: the GPU model with the most result rows (of equal
    counts, the first by name); the CPU, or whatever the rows name, where none ran on a GPU."""
    if rows.empty or HARDWARE not in rows:
        return None
    counts = rows[HARDWARE].fillna("").value_counts()
    gpus = counts[[h not in ("", "CPU", "cpu") for h in counts.index]]
    counts = gpus if not gpus.empty else counts
    return min(counts.index[counts == counts.max()]) if not counts.empty else None


def on_hardware(headline: list[HeadlineRow], rows: pd.DataFrame, hardware: str | None):
    """``headline`` and ``rows`` of ``hardware`` alone (all of them for None)."""
    if hardware is None or rows.empty:
        return headline, rows
    return [h for h in headline if h.hardware == hardware], rows[rows[HARDWARE] == hardware]


def readme_table(table: list[TableRow], context: str, others: list[str] | None = None,
                 report_link: str = "the report") -> str:
    """The README block: a lead line naming ``context`` (where and when), the table, and a line
    naming the ``others`` hardware whose figures only the report (``report_link``) holds."""
    lines = [f"Measured {context}; `≥` marks a lower bound, `emulated` a CP size run as rank 0 alone on one GPU "
             "(written by `python -m cpbench.report --readme`):", "",
             "| configuration | max N | × stock Boltz-2 | step time | reproduce |", "|---|---|---|---|---|"]
    for r in table:
        what = f"{r.model}, {WORKFLOW_TEXT.get(r.workflow, r.workflow)}, {r.cp_config}"
        command = "<br>".join(f"`{c}`" for c in dict.fromkeys(r.commands)) or DASH
        lines.append(f"| {what} | {r.max_n} | {r.vs_stock} | {r.step.text() if r.step else DASH} | {command} |")
    if not table:
        lines.append(f"| no result | {DASH} | {DASH} | {DASH} | {DASH} |")
    if others:
        lines += ["", f"Figures on {', '.join(others)}: {report_link}."]
    return "\n".join(lines)


def replace_marked_block(path: Path, block: str, start_marker: str = README_START,
                         end_marker: str = README_END) -> bool:
    """Replace the text between ``start_marker`` and ``end_marker`` in ``path`` by ``block`` (the
    markers stay); False, and the file unchanged, when the markers are missing or out of order."""
    text = path.read_text()
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        return False
    new = text[:start + len(start_marker)] + "\n" + block.strip("\n") + "\n" + text[end:]
    if new != text:
        path.write_text(new)
    return True


def _command(value) -> str | None:
    """A row's command, None where its record has no overrides (pandas gives NaN)."""
    return value if isinstance(value, str) and value else None


def _cp_order(cp_config: str) -> tuple[int, str]:
    """``1d cp=2 emulated`` -> ``(2, "1d cp=2 emulated")``: rows go by CP size, then topology."""
    size = cp_config.split("cp=", 1)[-1].split()[0] if "cp=" in cp_config else ""
    return (int(size) if size.isdigit() else 0, cp_config)
