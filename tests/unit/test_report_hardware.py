"""Figures of two GPU models are never one configuration: the report's headline, ratios, latest
timings and README table keep each GPU's apart (``rows.HARDWARE``), and a stopped probe whose
state predates its ``env`` takes the GPU model of its campaign folder's other records."""

from __future__ import annotations

import json
from pathlib import Path

from cpbench.report import build_report
from cpbench.report.load import load_records
from cpbench.report.readme import README_END, README_START
from cpbench.report.rows import hardware_of
from cpbench.results import SCHEMA_VERSION

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


def env(gpu: str, day: str = "2026-12-05") -> dict:
    return {"device": "cuda", "gpu_model": gpu, "date": f"{day}T12:00:00+00:00"}


def point(cp: int, n: int | None = None) -> dict:
    return {"workflow": "inference", "topology": "1d", "cp": cp, "mesh_shape": [cp], "N": n, "S": 256,
            "dtype": "bf16", "device": "cuda", "model": {"name": "m", "sampling": False, "kernels": "auto"}}


def probe(gpu: str, cp: int, max_n: int) -> dict:
    points = [{"N": n, "fits": True, "status": "ok", "peak_alloc_gib": [n / 1000] * cp} for n in (1024, max_n)]
    points.append({"N": max_n + 256, "fits": False, "status": "oom", "peak_alloc_gib": [None] * cp})
    return {"routine": "probe", "status": "ok", "message": "", "point": point(cp), "max_n": max_n,
            "first_fail_n": max_n + 256, "first_fail_status": "oom", "points": points, "env": env(gpu),
            "config": {"atoms_per_token": 8}}


def timing(gpu: str, cp: int, n: int, ms: float, day: str) -> dict:
    return {"routine": "timing", "status": "ok", "message": "", "point": point(cp, n), "median_ms": ms,
            "iqr_ms": 1.0, "peak_alloc_gib": 1.0, "peak_alloc_gib_per_rank": [1.0] * cp, "env": env(gpu, day),
            "config": {"atoms_per_token": 8}}


def write(root: Path, records: dict[str, dict]) -> Path:
    for name, record in records.items():
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))
    return root


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_two_gpus_are_two_configurations_in_the_headline_and_the_readme(tmp_path):
    root = write(tmp_path / "results", {
        "h200_cp1": probe(H200, 1, 16384), "h200_cp2": probe(H200, 2, 23040),
        "h100_cp2": probe(H100, 2, 12288),  # no H100 cp=1: no ratio, never the H200's cp=1
        "h200_t": timing(H200, 1, 2048, 5600.0, "2026-12-03"),
        "h100_t": timing(H100, 1, 2048, 5000.0, "2026-12-05"),  # later, elsewhere: not the H200's latest
    })
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{README_START}\n{README_END}\n")
    text = build_report(root, out=tmp_path / "docs" / "report.md", readme=readme)["markdown"].read_text()
    headline = section(text, "Headline")
    assert "| m on H200 | inference | 1d cp=2 | 23,040 | 1.41× cp=1 |" in headline, headline
    assert "| m on H100 80GB HBM3 | inference | 1d cp=2 | 12,288 | — |" in headline, headline
    table = readme.read_text()
    assert "Measured on NVIDIA H200 " in table and "23,040" in table and "12,288" not in table, table
    assert "5,600 ms at N=2,048" in table and "5,000 ms" not in table, table
    assert "Figures on NVIDIA H100 80GB HBM3: [report.md](docs/report.md)." in table, table


def test_a_stopped_probe_without_env_takes_its_campaign_folders_gpu(tmp_path):
    root = write(tmp_path / "results" / "call1", {"t": timing(H100, 1, 2048, 5000.0, "2026-12-05")}).parent
    state = root / "call1" / "p" / "probe_state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"signature": "s", "points": [
        {"N": 4096, "fits": True, "status": "ok", "peak_alloc_gib": [4.0], "order": 0}], "point": point(1)}))
    alone = root / "call2" / "p" / "probe_state.json"  # no other record in its folder: left unnamed
    alone.parent.mkdir(parents=True)
    alone.write_text(state.read_text())
    found = {path: rec for path, rec in load_records(root)}
    assert hardware_of(found[state]) == H100 and found[state]["env"]["gpu_model_from"] == "neighbours"
    assert hardware_of(found[alone]) == "cuda"


def test_the_estimate_times_each_gpu_from_its_own_measurements(tmp_path):
    from cpbench.estimate import estimate, table
    from cpbench.report.rows import probe_point_rows, result_rows

    root = write(tmp_path / "results", {
        "h200": timing(H200, 1, 2048, 5600.0, "2026-12-03"), "h100": timing(H100, 1, 2048, 5000.0, "2026-12-05")})
    found = load_records(root)
    answers = estimate(2048, result_rows(found, root), probe_point_rows(found), 80.0)
    times = {a.hardware: a.time_ms.value for a in answers}
    assert times == {H200: 5600.0, H100: 5000.0}
    assert "| H100 80GB HBM3 |" in table(answers, 2048, 80.0)
