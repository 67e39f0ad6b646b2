"""The headline command (#19): ``python -m cpbench -m workflow=training cp=2,4,8 N=...`` gives both
answers from one sweep: a timing row per (cp, N) and one max-N probe per cp (routine=auto).

On this CPU (no GPU) the default trunk runs at its tiny preset, cp is the number of gloo
processes, and the probe runs under the automatic training cap (config.AUTO_LIMIT_GIB). The
command is scaled to what it checks, the routing of one sweep: two cp values (1 and 2: the
mechanism is the same for 2, 4, 8, and 14 gloo processes per point cost minutes of process
starts on two cores), two N values (16 and 32, at most every probe's max N), and an MSA depth of
16 (S=16, not the default 256): the routing does not depend on S. Under the automatic training
cap both probes end at a real allocation failure with either depth (2-core machine, 2026-12-03:
max N 64, first failing 128 at cp=1, 128 and 192 at cp=2), and the command took 218 s of CPU time
at S=16 against 264 s at S=256 (user + system, on a machine shared with other jobs).
What the command as typed (cp=2,4,8 N=1024,2048) costs on two cores: docs/perf_notes.md.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from cpbench.results import iter_results

from helpers.run import REPO_ROOT, run_cpbench

HAS_REPORT = importlib.util.find_spec("cpbench.report") is not None
CPS, NS = (1, 2), (16, 32)


@pytest.fixture()
def frozen_code(tmp_path, monkeypatch) -> Path:
    """cpbench (its config tree inside) as it is now, first on PYTHONPATH of the controller and its workers:
    a point's signature hashes cpbench's sources, so an edit of the tree during the sweep would
    give the later jobs of a configuration another probe (as in tests/cluster)."""
    root = tmp_path / "code"
    for name in ("cpbench",):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return root


@pytest.mark.slow
def test_headline_command_times_every_point_and_probes_each_cp_once(tmp_path, frozen_code):
    sweep = tmp_path / "sweep"
    proc = run_cpbench(["-m", "workflow=training", f"cp={','.join(map(str, CPS))}", f"N={','.join(map(str, NS))}",
                        "S=16", f"hydra.sweep.dir={sweep}", "report.out=docs/cp_benchmark.md"], cwd=tmp_path, timeout_s=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [(path, r) for path, r in iter_results(sweep)]
    probes = {r["point"]["cp"]: (path, r) for path, r in records if r["routine"] == "probe"}
    timings = {(r["point"]["cp"], r["point"]["N"]): r for _, r in records if r["routine"] == "timing"}
    assert len(records) == len(CPS) + len(CPS) * len(NS), [(r["routine"], r["point"]) for _, r in records]

    # one probe per cp, bounded by a real allocation failure
    assert sorted(probes) == list(CPS)
    for cp, (path, probe) in probes.items():
        assert probe["status"] == "ok", probe["message"]
        assert probe["max_n"] is not None and probe["first_fail_status"] == "oom", (cp, probe["message"])
        assert probe["lower_bound"] is None and probe["first_fail_n"] > probe["max_n"]
        assert probe["point"]["memory_limit_gib"] is not None and "N=" not in " ".join(probe["overrides"])
        assert Path(path).parent.parent.name == "probes"

    # a timing row per (cp, N), each naming its configuration's probe; exactly one job ran each probe
    assert set(timings) == {(cp, n) for cp in CPS for n in NS}
    for (cp, n), timing in timings.items():
        assert timing["status"] == "ok", timing["message"]
        assert timing["median_ms"] > 0 and timing["point"]["memory_limit_gib"] is None
        assert Path(timing["probe"]["path"]) == Path(probes[cp][0])
    for cp in CPS:
        assert sum(timings[(cp, n)]["probe"]["ran_here"] for n in NS) == 1

    if HAS_REPORT:
        text = (tmp_path / "docs" / "cp_benchmark.md").read_text()
        for cp, (_, probe) in probes.items():
            assert f"{probe['max_n']:,} at cp={cp}" in text, text[:3000]
