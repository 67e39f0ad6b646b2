"""The aggregated report, built from real result files of CPU runs.

Two real sweeps feed it: the session's timing multirun of the tiny reference trunk
(``timing_multirun`` in conftest.py: 8 ok timing points), and a module-scoped probe sweep of a
test adapter whose per-rank memory is a real ``[N/cp, N, 64]`` float32 allocation under a CPU
memory cap (a probe with a max N, a first failing N, and a timing point that runs out of
memory). The tiny trunk's CPU peaks at test-sized N are a few MiB of resident set, below what
a quadratic fit can resolve; the growing adapter gives the memory model a real N² signal.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cpbench.report import build_report
from cpbench.results import SCHEMA_VERSION, iter_results
from cpbench.results.memory_fit import fit_peak_memory, fitting_points

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = "| N_tokens | N_atoms | MSA_seq | CP config | peak_mem (GiB) | walltime (ms) |"
SECTIONS = ("# CP benchmark", "## Run metadata", "## Results", "## Plots", "## Readout", "## Memory model", "## FLOPs")
# Relative error allowed when the memory model predicts a held-back probe point's peak: the CPU
# peak is a resident-set measurement, a few MiB noisy, of a ~0.1-0.2 GiB allocation.
HELD_BACK_TOLERANCE = 0.15
# 1024 x 1024 x 64 float32 = 0.25 GiB, more than the 0.24 GiB cap: it can never fit. (Under a
# 0.25 GiB cap it was the cap exactly, and with one intra-op thread, as on a pinned test process,
# N=1024 fitted in one run of three: the probe's verification then called it unstable.)
OOM_N = 1024


def _python_m(module: str, args: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


@pytest.fixture(scope="module")
def probe_sweep(tmp_path_factory) -> Path:
    """A real multirun: the probe of the growing test adapter under a 0.24 GiB cap, and a
    timing point at N=1024 that runs out of memory. The multirun's end callback writes the
    report into the sweep dir and into ``docs/cp_benchmark.md`` of the launch dir."""
    launch = tmp_path_factory.mktemp("report_probe")
    proc = _python_m("cpbench", [
        "-m", "routine=probe,timing", f"N={OOM_N}", "cp=1", "device=cpu", "model=adapter",
        "model._target_=tests.helpers.faults.GrowingAdapter", "memory.limit_gib=0.24",
        "probe.start=128", "probe.granularity=128", "timing.timeout_s=120", "probe.timeout_s=120",
        f"hydra.sweep.dir={launch / 'sweep'}", "report.out=docs/cp_benchmark.md"], cwd=launch, timeout_s=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return launch


def _records(root: Path) -> dict[str, dict]:
    return {str(path.relative_to(root)): rec for path, rec in iter_results(root)}


def _linked_images(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def test_multirun_end_writes_report_with_max_fit_and_oom_rows(probe_sweep):
    sweep, docs = probe_sweep / "sweep", probe_sweep / "docs"
    records = _records(sweep)
    probe = next(r for r in records.values() if r["routine"] == "probe")
    timing = next(r for r in records.values() if r["routine"] == "timing")
    assert probe["status"] == "ok" and probe["max_n"] and probe["first_fail_n"] > probe["max_n"]
    assert timing["status"] == "oom"
    for md_path in (sweep / "cp_benchmark.md", docs / "cp_benchmark.md"):
        text = md_path.read_text()
        assert all(section in text for section in SECTIONS)
        assert HEADER in text
        cause = probe["first_fail_status"].upper()
        assert re.search(rf"\| max-fit {probe['max_n']} \|.*\| 1d cp=1 \| [0-9.]+ \({cause}@{probe['first_fail_n']}\) \|",
                         text)
        assert re.search(rf"\| {OOM_N} \|.*\| 1d cp=1 \| .*\| oom \|", text)
        images = _linked_images(text)
        assert "cp_benchmark_max_n.png" in images and "cp_benchmark_memory.png" in images
        assert all((md_path.parent / image).is_file() for image in images)  # links valid where it lies
        assert "Walltime vs N: not drawn" in text  # no ok timing point here: said, not drawn
        assert (md_path.with_suffix(".csv")).is_file()


def test_memory_model_predicts_a_held_back_probe_point(probe_sweep):
    probe = next(r for r in _records(probe_sweep / "sweep").values() if r["routine"] == "probe")
    ns, peaks = fitting_points(probe["points"])
    assert len(ns) >= 4, probe["points"]
    held = len(ns) - 2  # the second-largest point that fit: inside the range, with a clear N² signal
    fit = fit_peak_memory(ns[:held] + ns[held + 1:], peaks[:held] + peaks[held + 1:], cp=1)
    predicted = fit.predict_gib(ns[held])
    assert predicted == pytest.approx(peaks[held], rel=HELD_BACK_TOLERANCE), (ns, peaks, fit.describe())


def test_cli_rebuilds_report_from_json_alone_with_every_failed_row(probe_sweep, tmp_path):
    # Only the result.json files (no multirun.yaml, no .hydra), plus rows for outcomes a CPU test
    # cannot produce in its budget, derived from the real records.
    real = _records(probe_sweep / "sweep")
    for rel, rec in real.items():
        (tmp_path / "results" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / rel).write_text(json.dumps({"schema": SCHEMA_VERSION, **rec}))
    timing = next(r for r in real.values() if r["routine"] == "timing")
    for status, cp in (("insufficient_gpus", 8), ("timeout", 2)):
        rec = {k: v for k, v in timing.items() if k not in ("peak_alloc_gib", "peak_reserved_gib")}
        rec.update(status=status, message=f"{status} (derived row)", point=dict(rec["point"], cp=cp, mesh_shape=[cp]))
        (tmp_path / "results" / status).mkdir()
        (tmp_path / "results" / status / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **rec}))
    proc = _python_m("cpbench.report", [str(tmp_path / "results"), "--out", str(tmp_path / "site" / "bench.md"),
                                        "--baseline-max-n", "500"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "site" / "bench.md").read_text()
    table = text[text.index(HEADER):].split("\n\n")[0].splitlines()[2:]
    assert len(table) == len(real) + 2
    for status in ("oom", "insufficient_gpus", "timeout"):
        assert f"| {status} |" in text
    assert "single-GPU baseline of 500" in text and "3 of 4 jobs did not finish ok" in text
    assert all((tmp_path / "site" / image).is_file() for image in _linked_images(text))
    assert (tmp_path / "site" / "bench.csv").is_file()


def test_report_of_timing_multirun_has_every_section(timing_multirun, tmp_path):
    written = build_report(timing_multirun, out=tmp_path / "docs" / "cp_benchmark.md")
    text = written["out_markdown"].read_text()
    assert all(section in text for section in SECTIONS)
    for item in ("| date |", "| torch |", "| git commit |", "| CPU |", "| CP configs | 1d cp=1, 1d cp=2 |",
                 "| command | `python -m cpbench -m "):
        assert item in text, item
    table = text[text.index(HEADER):].split("\n\n")[0].splitlines()
    assert len(table) == 2 + 8 and all("| ok |" in row for row in table[2:])
    assert {"plot_walltime", "plot_memory", "out_plot_walltime", "out_plot_memory"} <= set(written)
    assert all(written[key].is_file() for key in written)
    assert "Max N vs CP size: not drawn" in text  # timing only: no probe, said so
    readout = text.split("## Readout")[1].split("##")[0]
    assert "walltime grows as N^" in readout and "8 jobs finished ok" in readout
    assert "| block |" in text  # the analytic FLOPs of the tiny trunk's block


def test_csv_rows_match_their_result_json(timing_multirun, probe_sweep, tmp_path):
    for root in (timing_multirun, probe_sweep / "sweep"):
        build_report(root)
        csv = pd.read_csv(root / "cp_benchmark.csv")
        records = _records(root)
        assert sorted(csv["result"]) == sorted(records)
        for _, row in csv.iterrows():
            rec = records[row["result"]]
            assert row["status"] == rec["status"] and row["cp"] == rec["point"]["cp"]
            if rec["routine"] == "timing":
                assert row["N_tokens"] == rec["point"]["N"] and row["N_atoms"] == rec["point"]["N_atoms"]
                assert row["MSA_seq"] == rec["point"]["S"]
                for col, key in (("walltime (ms)", "median_ms"), ("peak_mem (GiB)", "peak_alloc_gib"),
                                 ("tokens/s", "tokens_per_s")):
                    assert (pd.isna(row[col]) and rec.get(key) is None) or row[col] == pytest.approx(rec[key])
            else:
                assert row["row"] == "max-fit" and row["N_tokens"] == rec["max_n"]
                assert row["first_fail_n"] == rec["first_fail_n"]
                assert row["peak_mem (GiB)"] == pytest.approx(rec["peak_alloc_gib"])


def test_a_probe_stopped_early_reads_as_a_lower_bound_from_its_state(probe_sweep, tmp_path):
    """A probe killed before its result.json (a scheduler's time limit) still reports: its
    probe_state.json and .hydra config give an ``incomplete`` row whose max N is a lower bound."""
    path, probe = next((p, r) for p, r in iter_results(probe_sweep / "sweep") if r["routine"] == "probe")
    job = tmp_path / "results" / "killed"
    shutil.copytree(path.parent, job)
    (job / "result.json").unlink()
    state = json.loads((job / "probe_state.json").read_text())
    assert state["point"]["cp"] == 1 and state["point"]["device"] == "cpu"
    # stopped after the point that failed first: the lower bound is the largest N below it
    failed_first = [p for p in state["points"] if p["N"] == probe["first_fail_n"]][0]["order"]
    state["points"] = [p for p in state["points"] if p["order"] <= failed_first]
    below = max(p["N"] for p in state["points"] if p["fits"])
    (job / "probe_state.json").write_text(json.dumps(state))
    out = build_report(tmp_path / "results")
    text = out["markdown"].read_text()
    assert re.search(rf"\| max-fit {below} \|.*\| 1d cp=1 \| [0-9.]+ \(OOM@{probe['first_fail_n']}\) \|.*\| incomplete \|",
                     text), text
    assert f"≥ {below:,} at cp=1" in text and "lower bound" in text


def test_a_probe_stopped_during_its_re_runs_keeps_its_finished_bracket(probe_sweep, tmp_path):
    """Stopped after the bisection ended (max N, then an out-of-memory within probe.granularity)
    but before the re-runs of the bracket's ends (probe.verify) finished: the bracket is the
    answer (no "≥"; the Headline names the end not re-run); a re-run that disagreed makes it unstable."""
    from cpbench.results import incomplete_probe

    path, probe = next((p, r) for p, r in iter_results(probe_sweep / "sweep") if r["routine"] == "probe")
    job = tmp_path / "results" / "killed"
    shutil.copytree(path.parent, job)
    (job / "result.json").unlink()
    state = json.loads((job / "probe_state.json").read_text())
    assert probe["first_fail_status"] == "oom" and probe["first_fail_n"] - probe["max_n"] <= 128  # its granularity
    again = {"N": probe["max_n"], "fits": True, "status": "ok", "message": ""}
    state["verify"] = {"max_n": again}
    (job / "probe_state.json").write_text(json.dumps(state))
    rec = incomplete_probe(job / "probe_state.json")
    assert rec["status"] == "ok" and (rec["max_n"], rec["first_fail_n"]) == (probe["max_n"], probe["first_fail_n"])
    assert rec["verify"]["max_n"] == again and str(probe["first_fail_n"]) in rec["verify"]["skipped"]
    text = build_report(tmp_path / "results")["markdown"].read_text()
    # the bracket, with the end that was not re-run named
    assert f"| {probe['max_n']:,} | — | OOM at {probe['first_fail_n']:,}; not re-run: {probe['first_fail_n']:,} |" \
        in text, text
    assert f"≥ {probe['max_n']:,}" not in text
    assert state["granularity"] == 128  # the probe saved what it bisected to
    state["verify"] = {"max_n": {**again, "fits": False, "status": "oom"}}
    (job / "probe_state.json").write_text(json.dumps(state))
    assert incomplete_probe(job / "probe_state.json")["status"] == "unstable"
    # an older state of an `auto` granularity: what it resolved to then is unknown, so no bracket
    config_path = job / ".hydra" / "config.yaml"
    config_path.write_text(config_path.read_text().replace("granularity: 128", "granularity: auto"))
    del state["granularity"]
    (job / "probe_state.json").write_text(json.dumps(state))
    assert incomplete_probe(job / "probe_state.json")["status"] == "incomplete"


def test_rows_name_a_sliced_model_and_sampled_inference():
    from cpbench.report.rows import model_label, workflow_label

    rec = {"point": {"workflow": "inference", "model": {"name": "boltz2", "sampling": True}},
           "overrides": ["model=boltz2", "model.blocks=1", "+model.msa_blocks=0", "N=512"]}
    assert model_label(rec) == "boltz2 [model.blocks=1 model.msa_blocks=0]"
    assert model_label({"point": {"model": {"name": "boltz2"}}, "overrides": ["cp=2"]}) == "boltz2"
    assert workflow_label(rec["point"]) == "inference+sampling"
    assert workflow_label({"workflow": "inference", "model": {"sampling": False}}) == "inference"


def test_rows_name_the_compiled_training_path_and_the_kernels_a_training_step_ran():
    from cpbench.report.rows import kernels_of, model_label

    compiled = {"workflow": "training", "device": "cuda",
                "model": {"name": "pairformer", "kernels": "auto", "compile_training": True}}
    eager = {"workflow": "training", "device": "cuda",
             "model": {"name": "pairformer", "kernels": "auto", "compile_training": False}}
    assert model_label({"point": compiled, "overrides": []}) == "boltz2 [model.compile_training=true]"
    assert model_label({"point": eager, "overrides": []}) == "boltz2"
    inference = {"workflow": "inference", "model": {**compiled["model"]}}
    assert model_label({"point": inference, "overrides": []}) == "boltz2"
    assert model_label({"point": {**compiled, "device": "cpu"}, "overrides": []}) == "boltz2"
    # records before kernels.ran said flex for a training step that ran the torch ops
    assert kernels_of({"point": eager, "stats": {"kernels": "flex"}}, eager["model"]) == "torch"
    assert kernels_of({"point": compiled, "stats": {"kernels": "flex"}}, compiled["model"]) == "flex"
    on_cpu = {**compiled, "device": "cpu"}  # no flex backward on a CPU: the torch ops ran
    assert kernels_of({"point": on_cpu, "stats": {"kernels": "flex"}}, on_cpu["model"]) == "torch"
    assert kernels_of({"point": inference, "stats": {"kernels": "flex"}}, {"kernels": "auto"}) == "flex"


def test_readout_takes_the_largest_fit_of_several_probes_of_one_cp():
    from cpbench.report.readout import max_n_sentences

    rows = pd.DataFrame([
        {"row": "max-fit", "model": "m", "workflow": "training", "topology": "1d", "cp": 1, "N_tokens": 1920,
         "status": "incomplete", "first_fail_status": "oom"},
        {"row": "max-fit", "model": "m", "workflow": "training", "topology": "1d", "cp": 1, "N_tokens": 1280,
         "status": "ok", "first_fail_status": "oom"},
        {"row": "max-fit", "model": "m", "workflow": "training", "topology": "1d", "cp": 2, "N_tokens": 2560,
         "status": "ok", "first_fail_status": "oom"},
    ])
    sentence, legend = max_n_sentences(rows, None)
    assert "max N ≥ 1,920 at cp=1, 2,560 at cp=2 (≤ 1.33× cp=1" in sentence, sentence
    assert "lower bound" in legend


def test_readout_marks_a_max_n_below_a_timeout_or_no_failure_as_a_lower_bound():
    """Only an out-of-memory bounds the max N from above: a probe whose first failure is a
    timeout, or that never failed, found a lower bound."""
    from cpbench.report.readout import max_n_sentences

    rows = pd.DataFrame([
        {"row": "max-fit", "model": "m", "workflow": "inference", "topology": "1d", "cp": cp, "N_tokens": n,
         "status": "ok", "first_fail_status": cause}
        for cp, n, cause in ((1, 8192, "timeout"), (2, 16384, "oom"), (4, 24576, None))])
    sentence = max_n_sentences(rows, None)[0]
    assert "max N ≥ 8,192 at cp=1, 16,384 at cp=2" in sentence and "≥ 24,576 at cp=4" in sentence, sentence


def test_walltime_readout_says_slower_when_cp_costs_time():
    from cpbench.report.readout import walltime_sentences

    rows = pd.DataFrame([
        {"row": "timing", "status": "ok", "model": "m", "workflow": "inference", "cp": cp, "CP config": cfg,
         "N_tokens": n, "walltime (ms)": ms}
        for cp, cfg, n, ms in ((1, "1d cp=1", 1024, 100.0), (1, "1d cp=1", 2048, 400.0),
                               (2, "1d cp=2", 1024, 110.0), (2, "1d cp=2", 2048, 200.0),
                               (2, "2d 1x2 cp=2", 2048, 500.0))])
    text = " ".join(walltime_sentences(rows))
    assert "1d cp=2 200.0 ms (2.00× faster than cp=1)" in text, text
    assert "2d 1x2 cp=2 500.0 ms (1.25× slower than cp=1)" in text, text


def test_a_rerun_timing_point_replaces_the_older_one_instead_of_averaging_with_it():
    """The 2d 1x2 slice at N=8192 was timed twice on the H200 (7978.7 ms, then 4477.9 ms after
    the attention kernel changed): the readout must read the latest, not their mean."""
    from cpbench.report.readout import walltime_sentences

    rows = pd.DataFrame([
        {"row": "timing", "status": "ok", "model": "m", "workflow": "inference", "cp": cp, "CP config": cfg,
         "N_tokens": 8192, "walltime (ms)": ms, "date": date}
        for cp, cfg, ms, date in ((1, "1d cp=1", 7557.9, "2026-11-30T12:00:00+00:00"),
                                  (2, "2d 1x2 cp=2", 4477.9, "2026-11-30T19:27:53+00:00"),
                                  (2, "2d 1x2 cp=2", 7978.7, "2026-11-30T17:10:00+00:00"))])
    text = " ".join(walltime_sentences(rows))
    assert "2d 1x2 cp=2 4477.9 ms (1.69× faster than cp=1)" in text, text
    assert "1 timing point was measured more than once" in text, text


def test_the_same_point_under_another_kernel_backend_is_another_point(tmp_path):
    """Call fr timed N=512 and 2,048 under flex, then under torch: the later torch rows must not
    replace the flex ones in the readout and the walltime plot."""
    from cpbench.report.analysis import latest_ok_timing
    from cpbench.report.plots import plot_walltime
    from cpbench.report.readout import walltime_sentences

    rows = pd.DataFrame([
        {"row": "timing", "status": "ok", "model": "m", "workflow": "inference", "cp": 1, "CP config": "1d cp=1",
         "N_tokens": n, "walltime (ms)": ms, "kernels": kernels, "date": date}
        for n, kernels, ms, date in ((512, "flex", 848.2, "2026-12-01T10:50:00"),
                                     (2048, "flex", 6405.0, "2026-12-01T10:49:00"),
                                     (512, "torch", 656.8, "2026-12-01T10:52:00"),
                                     (2048, "torch", 12836.6, "2026-12-01T10:51:00"))])
    assert len(latest_ok_timing(rows)) == 4
    text = " ".join(walltime_sentences(rows))
    assert "kernels=flex" in text and "kernels=torch" in text and "more than once" not in text, text
    assert plot_walltime(rows, tmp_path / "w.png") is None


def test_a_topology_without_a_cp1_probe_is_compared_against_another_topologys_cp1():
    from cpbench.report.readout import max_n_sentences

    rows = pd.DataFrame([
        {"row": "max-fit", "model": "m", "workflow": "inference", "topology": topo, "cp": cp, "N_tokens": n,
         "status": "ok", "first_fail_status": "oom"}
        for topo, cp, n in (("1d", 1, 12288), ("1d", 2, 16384), ("2d", 2, 16384))])
    one_d, two_d = max_n_sentences(rows, None)
    assert "16,384 at cp=2 (1.33× cp=1; ideal" in one_d, one_d
    assert "16,384 at cp=2 (1.33× cp=1 = 12,288 from the 1d probe; ideal" in two_d, two_d


def test_memory_predictions_are_set_beside_the_largest_measured_max_n_of_the_group():
    """A probe cut by a timeout (8192, a lower bound) and its rerun (16384, bounded by an oom):
    both fits are named by their N range and both compare against 16384."""
    from cpbench.report.memory_table import memory_tables

    def probe(peaks, max_n, fail_n):
        points = [{"N": n, "fits": True, "status": "ok", "peak_alloc_gib": [g]} for n, g in peaks]
        return {"routine": "probe", "point": {"cp": 2, "workflow": "inference", "topology": "2d",
                                              "mesh_shape": [1, 2], "model": {"name": "m"},
                                              "memory_limit_gib": 140.0},
                "points": points, "max_n": max_n, "first_fail_n": fail_n, "overrides": []}

    short = probe([(2048, 9.5), (4096, 35.5), (8192, 67.8)], 8192, 16384)
    rerun = probe([(2048, 9.5), (4096, 35.5), (8192, 67.8), (16384, 84.9)], 16384, 24576)
    _, predictions = memory_tables([short, rerun])
    at_cp2 = predictions[predictions["cp"] == 2]
    assert set(at_cp2["fit from"]) == {"inference 2d 1x2 cp=2, N 2,048–8,192",
                                       "inference 2d 1x2 cp=2, N 2,048–16,384"}, at_cp2
    assert set(at_cp2["measured"]) == {"16384 (fails 24576)"}, at_cp2


def _probe_record(signature: str, points: list[tuple[int, str, float | None]], seconds: float = 30.0,
                  verified: tuple[str, ...] = ()) -> dict:
    return {"routine": "probe", "signature": signature,
            "points": [{"N": n, "status": status, "fits": status == "ok", "peak_alloc_gib": [peak],
                        "seconds": seconds + n / 1000} for n, status, peak in points],
            "verify": {key: {"N": 0} for key in verified}}


def test_a_continued_probe_replaces_the_record_it_continued():
    """A probe resumed from a copy of its probe_state.json (same signature, its earlier points
    inside, as measured) supersedes the earlier record, whether it went on to more points or only
    to more of the bracket's re-runs; a probe that measured a point differently (another peak, or
    the same peaks in other seconds: a run of its own), or another signature, keeps its row."""
    from cpbench.results import without_continued_probes

    early = _probe_record("s", [(2048, "ok", 9.4), (4096, "ok", 34.9)])
    continued = _probe_record("s", [(2048, "ok", 9.4), (4096, "ok", 34.9), (8192, "oom", None)])
    rerun = _probe_record("s", [(2048, "ok", 9.5)])  # measured again, not copied
    other = _probe_record("t", [(2048, "ok", 9.4)])
    timing = {"routine": "timing", "signature": "s"}
    stopped = _probe_record("v", [(2048, "ok", 9.4), (2560, "oom", None)], verified=("max_n",))
    resumed = _probe_record("v", [(2048, "ok", 9.4), (2560, "oom", None)], verified=("max_n", "above"))
    again = _probe_record("v", [(2048, "ok", 9.4), (2560, "oom", None)], seconds=31.0, verified=("max_n",))
    found = [(Path(name), rec) for name, rec in (("a", early), ("b", continued), ("c", rerun), ("d", other),
                                                 ("e", timing), ("f", stopped), ("g", resumed), ("h", again))]
    kept = [str(path) for path, _ in without_continued_probes(found)]
    assert kept == ["b", "c", "d", "e", "g", "h"]


def test_a_memory_fit_without_the_pair_term_predicts_its_own_cp_only():
    """Scaling to another cp acts on the N² term; a fit that kept only b·N + c (the flattening
    inference probe of the first H200 campaign) must not claim the same max N at cp=2, 4, 8."""
    from cpbench.report.memory_table import memory_tables

    def probe(cp, peaks):
        points = [{"N": n, "fits": True, "status": "ok", "peak_alloc_gib": [g]} for n, g in peaks]
        return {"routine": "probe", "point": {"cp": cp, "workflow": "inference", "topology": "1d",
                                              "mesh_shape": [cp], "model": {"name": "m"}},
                "points": points, "max_n": peaks[-1][0], "first_fail_n": None, "overrides": []}

    flat = probe(1, [(1024, 6.5), (2048, 24.6), (4096, 101.3), (8192, 120.4), (12288, 121.1)])
    quad = probe(2, [(1024, 1.0 + 3e-7 * 1024**2), (2048, 1.0 + 3e-7 * 2048**2), (4096, 1.0 + 3e-7 * 4096**2)])
    fits, predictions = memory_tables([flat, quad])
    assert list(fits["form"]) == ["b·N+c", "a·N²+c"]
    by_source = predictions.groupby("fit from")["cp"].apply(list).to_dict()
    assert by_source == {"inference 1d cp=1, N 1,024–12,288": [1],
                         "inference 1d cp=2, N 1,024–4,096": [1, 2, 4, 8]}, by_source

    # the same probe run twice (equal peaks): one fit row and one prediction row per cp, not two
    fits, predictions = memory_tables([flat, quad, dict(quad)])
    assert len(fits) == 2 and list(predictions["cp"]) == [1, 1, 2, 4, 8], predictions
