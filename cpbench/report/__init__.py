"""The aggregated report: every ``result.json`` under a directory -> markdown, CSV and plots.

    python -m cpbench.report outputs/multirun/2026-11-30/12-00-00 [--out docs/cp_benchmark.md]
        [--baseline-max-n 8000] [--peak-tflops 774] [--readme README.md]

writes ``cp_benchmark.md``, ``cp_benchmark.csv`` and ``cp_benchmark_<plot>.png`` into the
directory, and with ``--out`` the same markdown at that path with its CSV and plots beside it
(links are relative, so both copies read correctly). With ``--readme`` the results table (max N,
step time and reproducing command per configuration, ``cpbench.report.readme``) replaces the text
between the README's ``<!-- headline:start -->`` and ``<!-- headline:end -->`` markers. It needs
nothing but the JSON files, and
failed jobs (oom, timeout, error, insufficient_gpus) and unstable probes keep their rows. The multirun's end
callback calls ``build_report(sweep_dir, out=report.out)``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd

from cpbench.report.backends import backends_section, read_parity
from cpbench.report.breakdown import breakdown_section
from cpbench.report.cp_curve import cp_curve_section, emulated_timing_section
from cpbench.report.headline import headline_rows, headline_section, run_context
from cpbench.report.load import load_records
from cpbench.report.peers import peers_section
from cpbench.report.plots import write_plots
from cpbench.report.readme import on_hardware, primary_hardware, readme_table, replace_marked_block, table_rows
from cpbench.report.readout import readout
from cpbench.report.rows import HARDWARE, hardware_of, probe_point_rows, result_rows
from cpbench.report.sections import flops_section, memory_section, metadata_section, plots_section, results_section

REPORT_STEM = "cp_benchmark"


def build_report(root, out=None, baseline_max_n: int | None = None,
                 peak_tflops: float | None = None, readme=None) -> dict[str, Path]:
    """Aggregate every ``result.json`` under ``root`` into the report.

    Args:
        root: the directory to aggregate (a sweep directory, or any folder of results).
        out: an extra markdown path (e.g. ``docs/cp_benchmark.md``); its CSV and plots go
            beside it, named after its stem.
        baseline_max_n: a user-supplied single-GPU max N for the readout; default: the
            results' ``report.baseline_max_n``.
        peak_tflops: the per-GPU peak for MFU; default: the results' ``report.peak_tflops``,
            else the measured table in ``cpbench.report.mfu``.
        readme: a markdown file whose headline block (between ``<!-- headline:start -->`` and
            ``<!-- headline:end -->``) is replaced by the headline, and its walltime block
            (``<!-- walltime:start -->`` ... ``<!-- walltime:end -->``) by the walltimes; left
            unchanged without the headline's markers.

    Returns:
        ``{"markdown", "csv", "plot_<name>"...}`` under ``root``, plus ``"out_markdown"``,
        ``"out_csv"`` and ``"out_plot_<name>"`` when ``out`` is given, and ``"readme"`` when
        the README's block was replaced.
    """
    root = Path(root).resolve()
    found = load_records(root)  # + probes stopped early; an unreadable file is one warning line
    records = [rec for _, rec in found]
    baseline_max_n = baseline_max_n or _from_report_config(records, "baseline_max_n")
    peak_tflops = peak_tflops or _from_report_config(records, "peak_tflops")
    rows = result_rows(found, root, peak_tflops)
    points = probe_point_rows(found)
    command = recorded_command(records, root)
    parity = read_parity(root)

    written: dict[str, Path] = {}
    root.mkdir(parents=True, exist_ok=True)
    plots = write_plots(rows, points, root, REPORT_STEM)
    written.update(_write(root / f"{REPORT_STEM}.md", rows, records, plots, command, baseline_max_n, "", parity))
    if out is not None:
        out = Path(out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        copied = []
        for name, title, path, reason in plots:
            target = out.parent / f"{out.stem}_{name}.png"
            if path is not None:
                if target != path:
                    shutil.copyfile(path, target)
            else:
                target.unlink(missing_ok=True)
            copied.append((name, title, target if path is not None else None, reason))
        written.update(_write(out, rows, records, copied, command, baseline_max_n, "out_", parity))
    if readme is not None:
        readme = Path(readme)
        main = primary_hardware(rows)
        headline, main_rows = on_hardware(headline_rows(rows, baseline_max_n), rows, main)
        others = sorted(set(rows[HARDWARE]) - {main}) if main is not None else []
        report_md = out if out is not None else root / f"{REPORT_STEM}.md"
        link = f"[{report_md.name}]({os.path.relpath(report_md, readme.resolve().parent)})"
        block = readme_table(table_rows(headline, main_rows),
                             run_context([r for r in records if main is None or hardware_of(r) == main], headline,
                                         routine=None), others, link)
        if replace_marked_block(readme, block):
            written["readme"] = readme
    return written


def render_markdown(rows: pd.DataFrame, records: list[dict], plots: list, command: str | None,
                    baseline_max_n: int | None, parity: list[dict] | None = None) -> str:
    """The whole report: title, metadata, headline, table, plots, readout, memory model, FLOPs,
    kernel backends (``parity``: the ``kernel_parity*.json`` lines found under the run), peer CP
    implementations."""
    sections = [
        "# CP benchmark",
        "Generated by `python -m cpbench.report` from the result.json files of the run "
        "(rebuild it with the same command on the run's directory).",
        metadata_section(records, rows, command),
        headline_section(headline_rows(rows, baseline_max_n)),
        cp_curve_section(rows),
        results_section(rows),
        emulated_timing_section(rows),
        plots_section(plots),
        "## Readout\n\n" + readout(rows, baseline_max_n),
        memory_section(records, rows),
        breakdown_section(records),
        flops_section(rows, records) if not rows.empty else "## FLOPs\n\nNo results.",
        backends_section(rows, parity or []),
        peers_section(rows),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _write(md_path: Path, rows, records, plots, command, baseline_max_n, prefix: str,
           parity: list[dict]) -> dict[str, Path]:
    csv_path = md_path.with_suffix(".csv")
    rows.to_csv(csv_path, index=False)
    md_path.write_text(render_markdown(rows, records, plots, command, baseline_max_n, parity))
    written = {f"{prefix}markdown": md_path, f"{prefix}csv": csv_path}
    written.update({f"{prefix}plot_{name}": path for name, _, path, _ in plots if path is not None})
    return written


def _from_report_config(records: list[dict], key: str):
    """The first non-null ``config.report.<key>`` among the records (the run's own setting)."""
    for rec in records:
        value = ((rec.get("config") or {}).get("report") or {}).get(key)
        if value not in (None, "null", ""):
            return value
    return None


def recorded_command(records: list[dict], root: Path) -> str | None:
    """The command that made the results: a record's ``command``, else rebuilt from the sweep's
    ``multirun.yaml`` (Hydra's record of the multirun's overrides), else a single job's own
    ``overrides``; None when nothing records it."""
    for rec in records:
        if rec.get("command"):
            return str(rec["command"])
    multirun = root / "multirun.yaml"
    if multirun.is_file():
        try:
            import yaml

            cfg = yaml.safe_load(multirun.read_text()) or {}
            overrides = (cfg.get("hydra") or {}).get("overrides") or {}
            hydra_args = [str(o) for o in overrides.get("hydra") or [] if not str(o).startswith("hydra.mode=")]
            return " ".join(["python -m cpbench -m"] + [str(t) for t in overrides.get("task") or []] + hydra_args)
        except Exception:  # noqa: BLE001 - an unreadable multirun.yaml only loses the command line
            pass
    if len(records) == 1 and records[0].get("overrides") is not None:
        return " ".join(["python -m cpbench"] + [str(t) for t in records[0]["overrides"]])
    return None
