"""The report's Headline, timeouts and unstable probes, built from hand-written result.json files.

No run is needed: each record holds only what the report reads of a probe (its point, max N,
first failing N and its cause, the points). The probes mirror the H200 campaign: a trunk-only
inference probe cut by a timeout below a with-sampling probe of the same cp.
"""

from __future__ import annotations

import json
from pathlib import Path

from cpbench.report import build_report
from cpbench.report.__main__ import main as report_main
from cpbench.report.headline import headline_rows
from cpbench.report.readme import README_END, README_START
from cpbench.report.rows import result_rows
from cpbench.results import SCHEMA_VERSION


def probe_record(workflow: str, cp: int, max_n: int, fail_n: int | None, cause: str | None, *,
                 sampling: bool = False, status: str = "ok", **extra) -> dict:
    points = [{"N": n, "fits": True, "status": "ok", "peak_alloc_gib": [n / 1000] * cp} for n in (2048, 4096, max_n)]
    if fail_n is not None:
        points.append({"N": fail_n, "fits": False, "status": cause, "peak_alloc_gib": [None] * cp})
    return {"routine": "probe", "status": status, "message": extra.pop("message", ""),
            "point": {"workflow": workflow, "topology": "1d", "cp": cp, "mesh_shape": [cp], "N": 1024, "S": 256,
                      "dtype": "bf16", "device": "cuda", "model": {"name": "m", "sampling": sampling}},
            "max_n": max_n, "first_fail_n": fail_n, "first_fail_status": cause, "points": points,
            "env": {"device": "cuda", "gpu_model": "NVIDIA H200", "date": "2026-11-30T12:00:00+00:00"},
            "config": {"atoms_per_token": 8}, **extra}


RECORDS = {
    # trunk only: cp=1 bounded by an oom; cp=2 cut by a timeout below sampling's cp=2 (as a record
    # migrated from schema 1 holds it: the timeout is first_fail_n too)
    "trunk_cp1": probe_record("inference", 1, 12288, 12416, "oom"),
    "trunk_cp2": probe_record("inference", 2, 8192, 16384, "timeout", timed_out_n=[16384], lower_bound="timeout"),
    "sampling_cp1": probe_record("inference", 1, 10240, 10368, "oom", sampling=True),
    "sampling_cp2": probe_record("inference", 2, 16384, 16512, "oom", sampling=True),
    # the new record form: the timed-out N in timed_out_n, never first_fail_n
    "training_cp1": probe_record("training", 1, 2560, None, None, timed_out_n=[3072], lower_bound="timeout",
                                 message="max_n is a lower bound: N=3072 timed out (probe.timeout_s=900)"),
    "training_cp2": probe_record("training", 2, 3584, 3712, "oom", status="unstable", lower_bound="unstable",
                                 message="N=3584 fit on its first run and failed (oom: ...) on its second"),
}


def write_results(root: Path) -> Path:
    for name, record in RECORDS.items():
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))
    return root


def section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def headline_of(root: Path, records: dict[str, dict]) -> str:
    """The report's Headline section over ``records`` (one folder each under ``root``)."""
    for name, record in records.items():
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))
    return section(build_report(root)["markdown"].read_text(), "Headline")


def test_headline_marks_a_timed_out_trunk_probe_below_sampling_as_a_lower_bound(tmp_path):
    root = write_results(tmp_path / "results")
    text = build_report(root)["markdown"].read_text()
    assert text.index("## Run metadata") < text.index("## Headline") < text.index("## Results")
    headline = section(text, "Headline")
    assert "| m | inference | 1d cp=2 | ≥ 8,192 | ≥ 0.67× cp=1 | timeout at 16,384 |" in headline, headline
    assert "| m | inference+sampling | 1d cp=2 | 16,384 | 1.60× cp=1 | OOM at 16,512 |" in headline, headline
    assert "| m | inference | 1d cp=1 | 12,288 | — | OOM at 12,416 |" in headline, headline
    assert "| m | training | 1d cp=1 | ≥ 2,560 | — | timeout at 3,072 |" in headline, headline
    assert "| m | training | 1d cp=2 | ≥ 3,584 | ~ 1.40× cp=1 | unstable |" in headline, headline


def test_a_timeout_is_never_written_as_a_failure_size(tmp_path):
    text = build_report(write_results(tmp_path / "results"))["markdown"].read_text()
    results = section(text, "Results")
    assert "TIMEOUT@" not in text
    assert "| max-fit ≥ 8192 |" in results and "(timeout at 16384)" in results
    assert "| max-fit ≥ 2560 |" in results and "(timeout at 3072)" in results
    assert "(OOM@12416)" in results  # an oom reads as before


def test_an_unstable_probe_is_a_row_with_its_status_and_not_a_clean_max_n(tmp_path):
    text = build_report(write_results(tmp_path / "results"))["markdown"].read_text()
    row = next(line for line in section(text, "Results").splitlines() if "| 1d cp=2 |" in line and "training" in line)
    assert "| unstable |" in row and "(OOM@3712; unstable)" in row and "max-fit ≥ 3584" in row, row
    readout = section(text, "Readout")
    assert "≥ 3,584 (unstable) at cp=2" in readout and "not a reproducible limit" in readout, readout
    assert "training 1d cp=2 N=3584: unstable: N=3584 fit on its first run" in section(text, "Results")


def test_an_oom_far_above_the_max_n_is_a_coarse_lower_bound(tmp_path):
    """A figure bisected only to 8,192 tokens (the old GPU probes) is not exact: ``≥``, with its bracket."""
    records = RECORDS | {"trunk_cp1": probe_record("inference", 1, 16384, 24576, "oom")}
    headline = headline_of(tmp_path, records)
    assert "| m | inference | 1d cp=1 | ≥ 16,384 | — | OOM at 24,576: a coarse bracket (8,192 tokens) |" in headline
    assert "| m | inference | 1d cp=2 | ≥ 8,192 | ~ 0.50× cp=1 |" in headline  # both ends lower bounds
    # 128 tokens (sampling, cp=2) is exact
    assert "| m | inference+sampling | 1d cp=2 | 16,384 | 1.60× cp=1 | OOM at 16,512 |" in headline, headline


def test_headline_rows_are_data_and_take_a_user_baseline(tmp_path):
    root = write_results(tmp_path / "results")
    rows = result_rows([(root / n / "result.json", r) for n, r in RECORDS.items()], root)
    by_config = {(h.workflow, h.cp): h for h in headline_rows(rows, baseline_max_n=8192)}
    trunk = by_config[("inference", 2)]
    assert (trunk.max_n, trunk.lower_bound, trunk.note) == (8192, "timeout", "timeout at 16,384")
    assert trunk.ratio_text() == "≥ 1.00× baseline"
    assert by_config[("inference", 1)].ratio_text() == "1.50× baseline"


def test_readme_block_is_replaced_between_its_markers(tmp_path, capsys):
    root = write_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nIntro.\n\n{README_START}\nhand-typed figures\n{README_END}\n\nSee the report.\n")
    assert report_main([str(root), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# x\n\nIntro.\n\n" + README_START) and text.endswith(README_END + "\n\nSee the report.\n")
    block = text.split(README_START)[1].split(README_END)[0]
    assert "hand-typed" not in block and "Measured on NVIDIA H200 (2026-11-30, m, bf16)" in block
    assert "| m, inference, trunk only, 1d cp=2 | ≥ 8,192 (timeout at 16,384) | — | — |" in block, block
    assert "| m, inference with sampling, 1d cp=2 | 16,384 (OOM at 16,512) | — | — |" in block, block
    assert report_main([str(root), "--readme", str(readme)]) == 0 and readme.read_text() == text  # idempotent

    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers here\n")
    assert report_main([str(root), "--readme", str(plain)]) == 0
    assert plain.read_text() == "no markers here\n"
    assert "warning" in capsys.readouterr().err


def test_a_verified_max_n_wins_over_an_older_lower_bound_of_the_same_n(tmp_path):
    """A configuration probed twice to the same N: the exact figure (an oom right above it) is the
    headline's and the readout's, not the older probe that never failed (order on disk either way)."""
    older = probe_record("training", 1, 2560, None, None)
    exact = probe_record("training", 1, 2560, 2816, "oom")
    for order, records in enumerate(((older, exact), (exact, older))):
        root = tmp_path / str(order)
        for i, record in enumerate(records):
            (root / f"p{i}").mkdir(parents=True)
            (root / f"p{i}" / "result.json").write_text(json.dumps({"schema": SCHEMA_VERSION, **record}))
        rows = result_rows([(root / f"p{i}" / "result.json", r) for i, r in enumerate(records)], root)
        (training,) = [h for h in headline_rows(rows) if h.workflow == "training"]
        assert (training.max_n_text(), training.lower_bound) == ("2,560", None), training
        text = build_report(root)["markdown"].read_text()
        assert "| m | training | 1d cp=1 | 2,560 | — | OOM at 2,816 |" in section(text, "Headline")
        assert "2,560 at cp=1" in section(text, "Readout") and "≥ 2,560" not in section(text, "Readout")


def test_a_bracket_whose_ends_were_not_re_run_says_which(tmp_path):
    """``probe.verify`` stopped by the probe's time budget: the bracket (a fit, an out-of-memory one
    granularity above) stands, and the Headline names the ends that were not re-run; a verified
    probe's note is the bracket alone."""
    verified = {"max_n": {"N": 16384, "fits": True}, "above": {"N": 16512, "fits": False, "status": "oom"}}
    records = RECORDS | {
        "sampling_cp2": probe_record("inference", 2, 16384, 16512, "oom", sampling=True, verify=verified),
        "trunk_cp1": probe_record("inference", 1, 12288, 12416, "oom",
                                  verify={"max_n": None, "above": None, "skipped": "stopped at probe.budget_s=420"}),
        "sampling_cp1": probe_record("inference", 1, 10240, 10368, "oom", sampling=True,
                                     verify={"max_n": {"N": 10240, "fits": True},
                                             "skipped": "the job stopped before re-running N=10368"}),
    }
    headline = headline_of(tmp_path, records)
    assert "| m | inference | 1d cp=1 | 12,288 | — | OOM at 12,416; not re-run: 12,288 and 12,416 |" in headline, headline
    assert "| m | inference+sampling | 1d cp=1 | 10,240 | — | OOM at 10,368; not re-run: 10,368 |" in headline, headline
    assert "| m | inference+sampling | 1d cp=2 | 16,384 | 1.60× cp=1 | OOM at 16,512 |" in headline, headline


def test_an_end_another_probe_measured_the_same_way_is_named_apart(tmp_path):
    """Two probes of one configuration (a probe on one commit, the same bracket probed afresh on the
    next): an end that ``probe.verify`` did not re-run but the other probe measured with the same
    outcome (its max N fitting, its first failure out of memory) is "re-run by another probe"; an
    end no other probe measured stays "not re-run"; a bracket the other probe does not share
    confirms nothing."""
    skipped = {"max_n": None, "above": None, "skipped": "stopped at probe.budget_s=420"}
    records = {
        "first": probe_record("training", 2, 3584, 3840, "oom", verify=skipped),
        "again": probe_record("training", 2, 3584, 3840, "oom", verify=skipped),
        # 2x4 on 256 tokens: the newer fit 46,592 (re-run), 46,848 out of memory as in the older probe
        "older": probe_record("inference", 4, 46336, 46848, "oom"),
        "newer": probe_record("inference", 4, 46592, 46848, "oom",
                              verify={"max_n": {"N": 46592, "fits": True}, "above": None, "skipped": "budget"}),
        # cp=1: the other probe (stopped early) measured neither end, so it confirms neither
        "cp1_a": probe_record("inference", 1, 12288, 12416, "oom", verify=skipped),
        "cp1_b": probe_record("inference", 1, 10240, None, None, status="incomplete"),
    }
    headline = headline_of(tmp_path, records)
    assert "| 3,584 | — | OOM at 3,840; re-run by another probe: 3,584 and 3,840 |" in headline, headline
    assert "| 46,592 | 3.79× cp=1 | OOM at 46,848; re-run by another probe: 46,848 |" in headline, headline
    assert "| 12,288 | — | OOM at 12,416; not re-run: 12,288 and 12,416 |" in headline, headline
