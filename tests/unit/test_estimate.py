"""cpbench.estimate on hand-written result.json files: the fits, the marks, the one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cpbench.estimate import fit_powers
from cpbench.harness.energy import energy_per_step, gpu_energy_j
from cpbench.report.rows import ENERGY_COLUMN, STAGE_PEAK_PREFIX, result_rows
from cpbench.results import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
PROTEIN = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"  # 76 aa


def timing_record(n: int, peak: float, ms: float, cp: int = 1, sampling_ms: float | None = None,
                  energy: list | None = None, stage_peaks: dict | None = None) -> dict:
    stage_ms = {"embedding": 1.0, "trunk": ms - 1.0 - (sampling_ms or 0.0)}
    if sampling_ms is not None:
        stage_ms["sampling"] = sampling_ms
    rec = {
        "routine": "timing", "status": "ok", "median_ms": ms, "peak_alloc_gib": peak,
        "peak_alloc_gib_per_rank": [peak] * cp, "iqr_ms": 0.0,
        "point": {"workflow": "inference", "topology": "1d", "cp": cp, "mesh_shape": [cp], "N": n, "N_atoms": 8 * n,
                  "S": 1, "dtype": "fp32", "device": "cuda",
                  "model": {"name": "toy", "sampling": sampling_ms is not None}},
        "stats": {"stage_ms": stage_ms},
        "env": {"device": "cuda", "gpu_memory_gib": 80.0, "date": "2026-12-01T00:00:00"},
    }
    if energy is not None:
        rec["energy_j_per_step_per_rank"] = energy
    if stage_peaks is not None:
        rec["stats"]["stage_peak_gib"] = stage_peaks
    return rec


def write_results(root: Path, records: list[dict]) -> Path:
    for i, rec in enumerate(records):
        (root / str(i)).mkdir(parents=True, exist_ok=True)
        (root / str(i) / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **rec}))
    return root


def fasta(path: Path, n: int) -> Path:
    path.write_text(">A|protein|empty\n" + (PROTEIN * (n // len(PROTEIN) + 1))[:n] + "\n")
    return path


def quadratic_results(root: Path, ns=(256, 512, 1024, 2048)) -> Path:
    # peak = 1e-5 N² + 1e-3 N + 2 GiB, time = 1e-7 N³ + 1e-4 N² + 5 ms (exact, so the fit recovers them)
    return write_results(root, [timing_record(n, 1e-5 * n * n + 1e-3 * n + 2, 1e-7 * n**3 + 1e-4 * n * n + 5)
                                for n in ns])


def run_estimate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpbench.estimate", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_fit_powers_recovers_a_cubic_and_keeps_coefficients_non_negative():
    ns = [256, 512, 1024, 2048]
    fit = fit_powers(ns, [1e-7 * n**3 + 1e-4 * n * n + 5 for n in ns], (3, 2, 0))
    assert fit.predict(1536) == pytest.approx(1e-7 * 1536**3 + 1e-4 * 1536**2 + 5, rel=1e-6)
    assert all(c >= 0 for c in fit.coefs.values())
    one = fit_powers([1000], [50.0], (3, 2, 0))
    assert set(one.coefs) == {3} and one.predict(1000) == pytest.approx(50.0)


def test_estimate_predicts_inside_the_range_marks_outside_and_uses_a_measured_point(tmp_path):
    results = quadratic_results(tmp_path / "results")
    inside = run_estimate(str(fasta(tmp_path / "in.fasta", 1536)), "--from", str(results), "--json")
    assert inside.returncode == 0, inside.stderr
    answer = json.loads(inside.stdout)["answers"][0]
    assert answer["peak_gib"]["source"] == "predicted"
    assert answer["peak_gib"]["value"] == pytest.approx(1e-5 * 1536**2 + 1e-3 * 1536 + 2, rel=1e-3)
    assert answer["time_ms"]["value"] == pytest.approx(1e-7 * 1536**3 + 1e-4 * 1536**2 + 5, rel=1e-3)
    assert answer["peak_gib"]["n_range"] == [256, 2048]
    assert answer["fits"]["G"] is True and answer["fits"]["40"] is True
    assert json.loads(inside.stdout)["gpu_gib"] == 80.0  # the GPU the results were measured on

    outside = run_estimate(str(fasta(tmp_path / "big.fasta", 4000)), "--from", str(results), "--gpu-gib", "40")
    assert outside.returncode == 0, outside.stderr
    assert "extrapolated" in outside.stdout
    big = json.loads(run_estimate(str(fasta(tmp_path / "big.fasta", 4000)), "--from", str(results),
                                  "--gpu-gib", "40", "--json").stdout)["answers"][0]
    assert big["peak_gib"]["source"] == "extrapolated" and big["time_ms"]["source"] == "extrapolated"
    # 166 GiB at cp=1: the N² term scaled by 1/cp fits 40 GiB first at cp=8
    assert big["fits"]["G"] is False and big["min_cp"] == 8

    measured = json.loads(run_estimate(str(fasta(tmp_path / "m.fasta", 512)), "--from", str(results),
                                       "--json").stdout)["answers"][0]
    assert measured["peak_gib"]["source"] == "measured" and measured["time_ms"]["source"] == "measured"


def test_sampling_stage_is_fitted_apart_and_energy_is_summed_over_ranks(tmp_path):
    ns = (512, 1024, 2048)
    results = write_results(tmp_path / "results", [
        timing_record(n, 1e-5 * n * n + 2, 1e-7 * n**3 + 5 + 2e-3 * n * n, sampling_ms=2e-3 * n * n,
                      cp=2, energy=[0.1 * n, 0.1 * n]) for n in ns])
    out = json.loads(run_estimate(str(fasta(tmp_path / "in.fasta", 1500)), "--from", str(results), "--json").stdout)
    answer = out["answers"][0]
    assert answer["workflow"] == "inference+sampling"
    assert answer["sampling_ms"]["value"] == pytest.approx(2e-3 * 1500**2, rel=1e-3)
    assert answer["trunk_ms"]["value"] == pytest.approx(1e-7 * 1500**3 + 5, rel=1e-3)
    assert "sampling stage" in answer["time_model"]
    assert answer["energy_j"]["value"] > 0
    rows = result_rows([(results / "0" / "result.json", json.loads((results / "0" / "result.json").read_text()))],
                       results)
    assert rows[ENERGY_COLUMN].iloc[0] == pytest.approx(2 * 0.1 * 512)


def test_energy_is_absent_not_zero_without_a_counter(tmp_path):
    results = write_results(tmp_path / "r", [timing_record(512, 3.0, 10.0, energy=[None, 5.0], cp=2),
                                             timing_record(1024, 3.0, 10.0, stage_peaks={"trunk": 2.5})])
    rows = result_rows([(p, json.loads(p.read_text())) for p in sorted(results.rglob("result.json"))], results)
    assert rows[ENERGY_COLUMN].isna().all()
    assert rows.set_index("N_tokens")[STAGE_PEAK_PREFIX + "trunk"][1024] == 2.5
    assert energy_per_step(None, 10.0, 5) is None and energy_per_step(0.0, 10.0, 5) == 2.0
    assert gpu_energy_j(None) is None


@pytest.mark.parametrize("case", ["unreadable", "no_results", "no_fit_model", "no_fit_workflow"])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, case):
    results = quadratic_results(tmp_path / "results")
    good = str(fasta(tmp_path / "in.fasta", 600))
    args = {
        "unreadable": [str(tmp_path / "missing.fasta"), "--from", str(results)],
        "no_results": [good, "--from", str(tmp_path / "empty")],
        "no_fit_model": [good, "--from", str(results), "--model", "nosuchmodel"],
        "no_fit_workflow": [good, "--from", str(results), "--workflow", "training"],
    }[case]
    (tmp_path / "empty").mkdir()
    proc = run_estimate(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    expect = {"unreadable": "missing.fasta", "no_results": "no result.json", "no_fit_model": "nosuchmodel",
              "no_fit_workflow": "training"}[case]
    assert expect in lines[0]


def test_the_shipped_large_complex_has_more_than_5000_tokens():
    from cpbench.data.real import resolve_input_sizes

    sizes = resolve_input_sizes({"inputs": "hemoglobin_9x.yaml", "ccd": None})
    assert (sizes.N, sizes.N_atoms, sizes.S) == (5166, 39420, 1)


def probe_record(points: list[tuple[int, float, bool]], max_n: int, cp: int = 1) -> dict:
    """A probe over ``(N, peak GiB, lean)`` points that all fit."""
    return {
        "routine": "probe", "status": "ok", "signature": f"probe{len(points)}", "max_n": max_n,
        "first_fail_n": None, "strategy": "predict",
        "points": [{"N": n, "fits": True, "status": "ok", "lean": lean, "peak_alloc_gib": [peak] * cp}
                   for n, peak, lean in points],
        "point": {"workflow": "inference", "topology": "1d", "cp": cp, "mesh_shape": [cp], "N": points[0][0],
                  "N_atoms": 8 * points[0][0], "S": 1, "dtype": "fp32", "device": "cuda",
                  "model": {"name": "toy", "sampling": False}},
        "env": {"device": "cuda", "gpu_memory_gib": 80.0, "date": "2026-12-01T00:00:00"},
    }


def test_a_probes_lean_points_alone_make_the_peak_fit(tmp_path):
    # lean (irreducible) peaks: 1e-5 N² + 1 GiB; the normal points carry a chunk budget of ~10 GiB on top
    lean = [(n, 1e-5 * n * n + 1, True) for n in (1024, 2048, 4096)]
    normal = [(n, 1e-5 * n * n + 1 + 10, False) for n in (512, 1024, 3072)]
    results = write_results(tmp_path / "r", [probe_record(lean + normal + [(6144, 1e-5 * 6144**2 + 1.5, False)], 6144)])
    answer = json.loads(run_estimate(str(fasta(tmp_path / "in.fasta", 5000)), "--from", str(results),
                                     "--json").stdout)["answers"][0]
    assert answer["peak_gib"]["value"] == pytest.approx(1e-5 * 5000**2 + 1, rel=1e-3)
    assert answer["peak_gib"]["n_range"] == [1024, 4096] and answer["peak_gib"]["n_points"] == 3
    assert answer["peak_gib"]["source"] == "extrapolated"


def test_the_same_n_under_two_kernel_backends_is_two_points(tmp_path):
    records = []
    for kernels, ms, date in (("flex", 100.0, "2026-12-01T00:00:00"), ("torch", 200.0, "2026-12-01T01:00:00")):
        for n in (512, 1024):
            rec = timing_record(n, 1e-5 * n * n + 1, ms * (n / 512) ** 3)
            rec["stats"]["kernels"] = kernels
            rec["env"]["date"] = date  # the torch runs are the later ones
            records.append(rec)
    results = write_results(tmp_path / "r", records)
    answers = json.loads(run_estimate(str(fasta(tmp_path / "in.fasta", 1024)), "--from", str(results),
                                      "--json").stdout)["answers"]
    by_kernels = {a["kernels"]: a for a in answers}
    assert set(by_kernels) == {"flex", "torch"}
    assert by_kernels["flex"]["time_ms"] == {**by_kernels["flex"]["time_ms"], "value": 800.0, "source": "measured"}
    assert by_kernels["torch"]["time_ms"]["value"] == 1600.0


def test_a_poor_peak_fit_is_flagged_in_the_table_and_the_json_keeps_its_keys(tmp_path):
    # free-memory budgets: the peak jumps between 1,024 and 2,048, no non-negative quadratic follows it
    peaks = {512: 1.0, 1024: 1.2, 2048: 40.0, 4096: 41.0}
    results = write_results(tmp_path / "r", [timing_record(n, p, 10.0 * n) for n, p in peaks.items()])
    text = run_estimate(str(fasta(tmp_path / "in.fasta", 700)), "--from", str(results))
    assert text.returncode == 0, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith("| toy"))
    assert "poor fit: max residual" in row.split(" | ")[3]
    answer = json.loads(run_estimate(str(fasta(tmp_path / "in.fasta", 700)), "--from", str(results),
                                     "--json").stdout)["answers"][0]
    assert set(answer["peak_gib"]) == {"value", "source", "n_range", "n_points", "model"}
    good = quadratic_results(tmp_path / "good")
    assert "poor fit" not in run_estimate(str(fasta(tmp_path / "in.fasta", 700)), "--from", str(good)).stdout


def test_energy_uses_the_power_measured_near_the_inputs_n(tmp_path):
    # 200 W at N=512, 600 W at N=2,048 (energy = power × step time)
    results = write_results(tmp_path / "r", [
        timing_record(n, 1e-5 * n * n + 1, ms, energy=[watts * ms / 1e3])
        for n, ms, watts in ((512, 500.0, 200.0), (1024, 2000.0, 300.0), (2048, 8000.0, 600.0))])
    answer = json.loads(run_estimate(str(fasta(tmp_path / "in.fasta", 600)), "--from", str(results),
                                     "--json").stdout)["answers"][0]
    watts = 200.0 + (600 - 512) / (1024 - 512) * 100.0
    assert answer["energy_j"]["value"] == pytest.approx(watts * answer["time_ms"]["value"] / 1e3, rel=1e-6)
    assert answer["energy_j"]["source"] == "predicted" and answer["energy_j"]["n_range"] == [512, 2048]
