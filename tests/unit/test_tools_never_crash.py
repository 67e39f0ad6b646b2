"""``python -m cpbench.estimate`` and ``python -m cpbench.report`` on real data: the results committed
under docs/benchmarks/, and a directory holding one result.json of every status (made from the
committed records) beside files that cannot be read. Every run ends with exit code 0; a file that
cannot be read is one stderr line naming it, never a traceback."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cpbench.estimate import DEFAULT_RESULTS
from cpbench.estimate.__main__ import main as estimate_main
from cpbench.results import iter_results
from cpbench.results.probe_state import without_continued_probes

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "benchmarks"
UBIQUITIN = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"
# Ubiquitin with aspirin as a SMILES ligand (76 residues + 13 heavy atoms = 89 tokens): the input
# on which the estimate once failed over the committed results (a group whose kernels were empty).
UBIQUITIN_LIGAND_YAML = f"""version: 1
sequences:
  - protein:
      id: A
      sequence: {UBIQUITIN}
  - ligand:
      id: L
      smiles: 'CC(=O)Oc1ccccc1C(=O)O'
"""


def _python_m(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout_s)


def _strict_json(text: str):
    """JSON as other tools read it: a NaN or Infinity is an error, not a value."""
    def reject(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=reject)


# ---------------------------------------------------------------------------------------------
# The committed results
# ---------------------------------------------------------------------------------------------

def test_the_estimate_reads_the_committed_results_by_default_and_says_so(tmp_path):
    fasta = tmp_path / "ubiquitin.fasta"
    fasta.write_text(f">A|protein|\n{UBIQUITIN}\n")
    proc = _python_m("cpbench.estimate", str(fasta))
    assert proc.returncode == 0 and not proc.stderr, proc.stderr[-2000:]
    results = next(line for line in proc.stdout.splitlines() if line.startswith("Results: "))
    assert str(DEFAULT_RESULTS) in results and "default" in results and DEFAULT_RESULTS == COMMITTED
    assert "| boltz2 |" in proc.stdout and "| stock-boltz2 |" in proc.stdout


def test_the_estimate_of_a_ligand_input_over_the_committed_results_is_strict_json(tmp_path, capsys):
    pytest.importorskip("rdkit")  # a SMILES ligand needs the [real] extra
    yaml = tmp_path / "ubiquitin_aspirin.yaml"
    yaml.write_text(UBIQUITIN_LIGAND_YAML)
    assert estimate_main([str(yaml), "--from", str(COMMITTED), "--json"]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["input"]["N"] == 89 and out["results"] == str(COMMITTED)
    assert {a["model"] for a in out["answers"]} >= {"boltz2", "stock-boltz2"}
    assert all(a["kernels"] is None or isinstance(a["kernels"], str) for a in out["answers"])


def test_the_report_builds_from_the_committed_results(tmp_path):
    # a copy: the report writes cp_benchmark.md into the directory it reads
    results = tmp_path / "benchmarks"
    shutil.copytree(COMMITTED, results, ignore=shutil.ignore_patterns("*.png", "cp_benchmark*", "*.log"))
    proc = _python_m("cpbench.report", str(results))
    assert proc.returncode == 0 and not proc.stderr, proc.stderr[-2000:]
    rows = pd.read_csv(results / "cp_benchmark.csv")
    # every result is a row, except a probe record that a later run of the same probe continued
    # (its final record is the row); the probes stopped early add rows of their own
    kept = without_continued_probes(list(iter_results(COMMITTED)))
    assert 0 < len(kept) < len(list(COMMITTED.rglob("result.json")))  # the committed results hold continued probes
    assert {str(path.relative_to(COMMITTED)) for path, _ in kept} <= set(rows["result"].astype(str))
    text = (results / "cp_benchmark.md").read_text()
    assert "## Readout" in text and "max-fit" in text


def test_the_estimate_without_committed_results_asks_for_from(monkeypatch, tmp_path, capsys):
    """An installed (non-editable) package has no docs/benchmarks/ beside it."""
    import cpbench.estimate as estimate

    monkeypatch.setattr(estimate, "DEFAULT_RESULTS", tmp_path / "absent")
    fasta = tmp_path / "in.fasta"
    fasta.write_text(f">A|protein|\n{UBIQUITIN}\n")
    assert estimate_main([str(fasta)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--from DIR" in err[0] and "absent" in err[0]


# ---------------------------------------------------------------------------------------------
# One result of every status, and files that cannot be read
# ---------------------------------------------------------------------------------------------

def _committed(routine: str, status: str, max_n_none: bool | None = None) -> dict:
    """The first committed record (sorted by path) of ``routine`` and ``status``."""
    for path in sorted(COMMITTED.rglob("result.json")):
        rec = json.loads(path.read_text())
        if (rec.get("routine"), rec.get("status")) == (routine, status) and \
                (max_n_none is None or (rec.get("max_n") is None) == max_n_none):
            return rec
    raise LookupError(f"no committed {routine} record of status {status}")


def every_status() -> dict[str, dict]:
    """One record per status (and a probe whose max N is None), from the committed records."""
    timing, probe = _committed("timing", "ok"), _committed("probe", "ok", max_n_none=False)
    records = {"ok_timing": timing, "ok_probe": probe,
               "insufficient_gpus": _committed("timing", "insufficient_gpus"),
               "timeout_timing": _committed("timing", "timeout"),
               "timeout_probe_no_max_n": _committed("probe", "timeout", max_n_none=True)}
    oom = copy.deepcopy(timing)
    oom.update(status="oom", median_ms=None, iqr_ms=None, min_ms=None, max_ms=None, times_ms=[], tokens_per_s=None,
               peak_alloc_gib=None, peak_reserved_gib=None,
               message="CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (most recent call last): ...")
    records["oom_timing"] = oom
    first = copy.deepcopy(probe["points"][0])
    first.update(fits=False, status="oom", peak_alloc_gib=[None], peak_reserved_gib=[None], lean=False)
    nothing_fit = copy.deepcopy(probe)
    nothing_fit.update(status="ok", max_n=None, first_fail_n=first["N"], first_fail_status="oom", points=[first],
                       peak_alloc_gib=None, peak_reserved_gib=None, lower_bound=None,
                       message=f"N={first['N']} out of memory: no N fits", signature="nothing-fit")
    records["oom_probe_no_max_n"] = nothing_fit
    error = copy.deepcopy(timing)
    for key in ("median_ms", "iqr_ms", "min_ms", "max_ms", "times_ms", "tokens_per_s", "stats"):
        error.pop(key, None)
    error.update(status="error", point={}, message="Traceback (most recent call last):\n  ...\nRuntimeError: boom")
    records["error_before_its_point"] = error
    unstable = copy.deepcopy(probe)
    unstable.update(status="unstable", verify={"max_n": {"N": probe["max_n"], "fits": False}}, lower_bound="unstable",
                    message=f"max N {probe['max_n']} did not fit on its re-run", signature="unstable")
    records["unstable_probe"] = unstable
    return records


BROKEN = {
    "truncated": '{"routine": "timing", "status": "o',
    "empty": "",
    "a_list": "[1, 2, 3]",
}


def _status_dir(root: Path) -> tuple[Path, list[Path]]:
    """``root`` holding every_status() and the unreadable files; ``(root, paths of the unreadable)``."""
    for name, rec in every_status().items():
        (root / name).mkdir(parents=True)
        (root / name / "result.json").write_text(json.dumps(rec))
    broken = []
    for name, text in BROKEN.items():
        (root / name).mkdir(parents=True)
        broken.append(root / name / "result.json")
        broken[-1].write_text(text)
    bad_points = copy.deepcopy(_committed("probe", "ok", max_n_none=False))
    bad_points["points"] = ["512 fits", "1024 oom"]  # a field of the wrong type
    bad_env = copy.deepcopy(_committed("timing", "ok"))
    bad_env["env"] = "NVIDIA H200"
    for name, rec in (("bad_points", bad_points), ("bad_env", bad_env)):
        (root / name).mkdir(parents=True)
        broken.append(root / name / "result.json")
        broken[-1].write_text(json.dumps(rec))
    return root, broken


def _assert_one_line_per_unreadable(stderr: str, broken: list[Path]) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == len(broken), stderr
    for path in broken:
        assert sum(str(path) in line for line in lines) == 1, (path, stderr)


def test_the_report_has_a_row_for_every_status_and_one_line_per_unreadable_file(tmp_path):
    root, broken = _status_dir(tmp_path / "results")
    proc = _python_m("cpbench.report", str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_one_line_per_unreadable(proc.stderr, broken)
    rows = pd.read_csv(root / "cp_benchmark.csv")
    assert sorted(rows["result"].str.split("/").str[0]) == sorted(every_status())
    assert set(rows["status"]) == {"ok", "oom", "timeout", "error", "insufficient_gpus", "unstable"}
    assert rows.loc[rows["result"].str.startswith("oom_probe_no_max_n"), "N_tokens"].isna().all()


def test_the_estimate_over_every_status_answers_and_names_each_unreadable_file(tmp_path):
    root, broken = _status_dir(tmp_path / "results")
    fasta = tmp_path / "in.fasta"
    fasta.write_text(f">A|protein|\n{UBIQUITIN}\n")
    proc = _python_m("cpbench.estimate", str(fasta), "--from", str(root), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_one_line_per_unreadable(proc.stderr, broken)
    out = _strict_json(proc.stdout)
    assert out["answers"] and out["results"] == str(root)
