"""The report's Kernel backends section: the same point under ``torch`` and ``flex`` side by side
with the speed-up, and the deviation table from a ``kernel_parity*.json`` of the run."""

from __future__ import annotations

import json
from pathlib import Path

from cpbench.report import build_report
from cpbench.report.readme import README_END, README_START
from cpbench.results import SCHEMA_VERSION

PAIRFORMER = "cpbench.models.pairformer.adapter.PairformerAdapter"


def timing_record(n: int, kernels: str | None, median_ms: float, peak_gib: float, date: str) -> dict:
    stats = {"stage_ms": {"trunk": median_ms}} | ({"kernels": kernels} if kernels else {})
    return {"routine": "timing", "status": "ok", "message": "",
            "point": {"workflow": "inference", "topology": "1d", "cp": 1, "mesh_shape": [1], "N": n, "S": 256,
                      "N_atoms": 8 * n, "dtype": "bf16", "device": "cuda",
                      "model": {"name": "boltz2", "_target_": PAIRFORMER, "sampling": False}},
            "median_ms": median_ms, "iqr_ms": 1.0, "times_ms": [median_ms] * 5, "peak_alloc_gib": peak_gib,
            "peak_reserved_gib": peak_gib, "tokens_per_s": n / median_ms * 1e3, "stats": stats,
            "env": {"device": "cuda", "gpu_model": "NVIDIA H200", "date": date}, "config": {}}


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def write(root: Path, name: str, record: dict) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))


def test_backends_side_by_side_with_speedup_and_parity(tmp_path):
    root = tmp_path / "run"
    write(root, "flex_2048", timing_record(2048, "flex", 6000.0, 13.5, "2026-12-01T05:10:00+00:00"))
    write(root, "torch_2048", timing_record(2048, "torch", 12000.0, 17.4, "2026-12-01T05:12:00+00:00"))
    # an older record without stats.kernels: the reference trunk before the switch ran the torch path
    write(root, "old_512", timing_record(512, None, 640.0, 1.5, "2026-11-30T05:00:00+00:00"))
    write(root, "flex_512", timing_record(512, "flex", 400.0, 1.3, "2026-12-01T05:13:00+00:00"))
    (root / "kernel_parity.json").write_text(json.dumps({"gpu": "NVIDIA H200", "torch": "2.11", "results": [
        {"what": "block", "backend": "flex", "dtype": "bf16", "N": 256, "outputs": {"s": 1e-3, "z": 4e-3},
         "param_grad_median_rel": 3e-3, "worst": "grad/x", "worst_rel": 1e-2, "tol": 0.05, "ok": True}]}))
    text = section(build_report(root)["markdown"].read_text(), "Kernel backends")
    rows = [line for line in text.splitlines() if line.startswith("| boltz2")]
    assert len(rows) == 4
    assert "| 2,048 | flex | 6,000.0 | 13.50 | 2.00× |" in text
    assert "| 2,048 | torch | 12,000.0 | 17.40 | 1.00× |" in text
    assert "| 512 | flex | 400.0 | 1.30 | 1.60× |" in text and "| 512 | torch | 640.0 |" in text
    assert "| flex | block | bf16 | 256 | 4.00e-03 | 3.00e-03 | 1.00e-02 (grad/x) | 0.05 | yes |" in text


def test_compiled_training_pairs_with_the_torch_training_step(tmp_path):
    """The compiled flex training point carries its own model label (its max N is its own) but
    is the same training step as the ``torch`` one: the two pair in the backends table."""
    root = tmp_path / "run"
    for name, kernels, ms, date in (("flex", "flex", 20_000.0, "2026-12-02T08:20:00+00:00"),
                                    ("torch", "torch", 60_000.0, "2026-12-02T08:10:00+00:00")):
        record = timing_record(1536, kernels, ms, 56.0, date)
        record["point"]["workflow"] = "training"
        record["point"]["model"] |= {"kernels": kernels, "compile_training": True}
        write(root, f"train_{name}", record)
    markdown = build_report(root)["markdown"].read_text()
    assert "boltz2 [model.compile_training=true]" in markdown  # the flex row's own label stays in the table
    text = section(markdown, "Kernel backends")
    assert "| boltz2 | training | 1d cp=1 | 1,536 | flex | 20,000.0 | 56.00 | 3.00× |" in text
    assert "| boltz2 | training | 1d cp=1 | 1,536 | torch | 60,000.0 | 56.00 | 1.00× |" in text


def test_graph_replayed_point_is_its_own_backend_row(tmp_path):
    """``model.cuda_graphs=true`` runs the same point another way: ``flex+graphs`` beside ``flex``
    and ``torch``; a point whose capture failed ran eagerly and counts as plain ``flex``."""
    root = tmp_path / "run"
    write(root, "torch", timing_record(512, "torch", 620.0, 1.5, "2026-12-03T05:00:00+00:00"))
    write(root, "flex", timing_record(512, "flex", 450.0, 1.2, "2026-12-03T05:01:00+00:00"))
    graphed = timing_record(512, "flex", 155.0, 1.2, "2026-12-03T05:02:00+00:00")
    graphed["stats"] |= {"cuda_graphs": "replay", "graph_capture_s": 0.8}
    write(root, "graphs", graphed)
    failed = timing_record(1024, "flex", 900.0, 2.0, "2026-12-03T05:03:00+00:00")
    failed["stats"] |= {"cuda_graphs": "capture failed: operation not permitted"}
    write(root, "failed", failed)
    write(root, "torch_1024", timing_record(1024, "torch", 1800.0, 2.5, "2026-12-03T05:04:00+00:00"))
    text = section(build_report(root)["markdown"].read_text(), "Kernel backends")
    assert "| 512 | flex+graphs | 155.0 | 1.20 | 4.00× |" in text
    assert "| 512 | flex | 450.0 |" in text and "| 512 | torch | 620.0 |" in text
    assert "| 1,024 | flex | 900.0 | 2.00 | 2.00× |" in text and "graphs | 900.0" not in text


def test_backends_section_says_when_nothing_was_compared(tmp_path):
    root = tmp_path / "run"
    write(root, "torch_2048", timing_record(2048, "torch", 12000.0, 17.4, "2026-12-01T05:12:00+00:00"))
    text = section(build_report(root)["markdown"].read_text(), "Kernel backends")
    assert "No point was measured under two backends" in text


def test_readme_table_gives_each_whole_model_step_on_its_fastest_backend(tmp_path):
    """The README's step times come from the report: per configuration, at its largest timed N,
    the fastest backend's latest median with ``torch`` beside it (a depth slice is not a step of
    the model: no row), and the command that measured it."""
    root = tmp_path / "run"
    write(root, "flex_2048_old", timing_record(2048, "flex", 7000.0, 13.5, "2026-12-01T05:00:00+00:00"))
    write(root, "flex_2048", timing_record(2048, "flex", 6000.0, 13.5, "2026-12-01T05:10:00+00:00"))
    write(root, "torch_2048", timing_record(2048, "torch", 12000.0, 17.4, "2026-12-01T05:12:00+00:00"))
    write(root, "torch_512", timing_record(512, "torch", 640.0, 1.5, "2026-12-01T05:13:00+00:00"))
    sliced = timing_record(4096, "torch", 1177.0, 9.0, "2026-12-01T05:14:00+00:00")
    sliced["overrides"] = ["model.blocks=1"]
    write(root, "slice_4096", sliced)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\nhand-typed\n{README_END}\n")
    build_report(root, readme=readme)
    block = readme.read_text().split(README_START)[1].split(README_END)[0]
    assert "hand-typed" not in block and "Measured on NVIDIA H200 (2026-12-01, bf16)" in block
    rows = [line for line in block.splitlines() if line.startswith("| boltz2")]
    assert len(rows) == 1 and "model.blocks" not in block, block
    assert rows[0] == ("| boltz2, inference, trunk only, 1d cp=1 | — | — | "
                       "6,000 ms at N=2,048 (flex; 2026-12-01; torch 12,000 ms, 2.00×) | — |"), rows  # no overrides recorded


def test_a_torch_figure_from_another_day_is_dated_where_it_is_compared(tmp_path):
    """A ratio whose ``torch`` run was not side by side (another day) names that run's date, in the
    README's table and in the Kernel backends table."""
    root = tmp_path / "run"
    write(root, "flex_1024", timing_record(1024, "flex", 1000.0, 5.0, "2026-12-02T05:10:00+00:00"))
    write(root, "torch_1024", timing_record(1024, "torch", 2500.0, 5.1, "2026-11-30T05:12:00+00:00"))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_START}\n{README_END}\n")
    build_report(root, readme=readme)
    block = readme.read_text().split(README_START)[1].split(README_END)[0]
    assert "1,000 ms at N=1,024 (flex; 2026-12-02; torch 2,500 ms on 2026-11-30, 2.50×)" in block
    table = section((root / "cp_benchmark.md").read_text(), "Kernel backends")
    assert "| 1,024 | torch | 2,500.0 | 5.10 | 1.00× | 2026-11-30 |" in table
    assert "| 1,024 | flex | 1,000.0 | 5.00 | 2.50× | 2026-12-02 |" in table


def test_triton_passes_are_their_own_backend_row(tmp_path):
    """``model.passes=triton`` (``stats.passes``) runs the same point another way: ``flex+triton``
    (``flex+triton+graphs`` when its blocks replayed a graph; ``flex+triton+tattn`` with
    ``model.attention=triton``) beside ``flex``, never merged with it."""
    root = tmp_path / "run"
    write(root, "torch", timing_record(2048, "torch", 12700.0, 9.0, "2026-12-05T05:00:00+00:00"))
    write(root, "flex", timing_record(2048, "flex", 5600.0, 8.5, "2026-12-05T05:01:00+00:00"))
    triton = timing_record(2048, "flex", 5100.0, 6.6, "2026-12-05T05:02:00+00:00")
    triton["stats"] |= {"passes": "triton"}
    write(root, "triton", triton)
    graphed = timing_record(2048, "flex", 5000.0, 6.6, "2026-12-05T05:03:00+00:00")
    graphed["stats"] |= {"passes": "triton", "cuda_graphs": "replay", "graph_capture_s": 0.5}
    write(root, "triton_graphs", graphed)
    attention = timing_record(2048, "flex", 4800.0, 6.6, "2026-12-05T05:04:00+00:00")
    attention["stats"] |= {"passes": "triton", "attention": "triton"}
    write(root, "triton_attention", attention)
    text = section(build_report(root)["markdown"].read_text(), "Kernel backends")
    assert "| 2,048 | flex+triton | 5,100.0 | 6.60 |" in text, text
    assert "| 2,048 | flex+triton+tattn | 4,800.0 | 6.60 |" in text, text
    assert "| 2,048 | flex+triton+graphs | 5,000.0 | 6.60 |" in text, text
    assert "| 2,048 | flex | 5,600.0 | 8.50 |" in text, text
