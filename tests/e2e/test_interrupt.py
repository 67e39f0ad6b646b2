"""Ctrl-C and SIGTERM end ``python -m cpbench`` cleanly (a real CPU probe of the tiny trunk).

The signal goes to the main process only (workers live in sessions of their own) once the
first probe point is in ``probe_state.json`` and the next point's workers are running. The run
must end with 130 (SIGINT) / 143 (SIGTERM), no traceback, one stderr line naming what was
measured and the command that continues, the probe state kept, and no worker left behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.run import run_command

# A probe of small steps (what is checked is the signal's handling, not the sizes): a shallow MSA,
# two atoms per token, no sampler.
PROBE = ["device=cpu", "model=tiny", "cp=2", "routine=probe", "probe.start=32", "probe.depth=null",
         "probe.max_points=3", "S=16", "atoms_per_token=2", "workflow.sampling=false"]
WAIT_S = 60


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (a /proc scan)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and "cpbench.harness.worker" in cmdline:
            pids.append(int(entry.name))
    return pids


def _interrupt(tmp_path: Path, args: list[str], state_glob: str, signum: int) -> tuple[int, str, str, Path]:
    """Start cpbench, wait for a probe state and the next point's workers, send ``signum``;
    returns (exit code, stdout, stderr, the workers' temp dir)."""
    worker_tmp = tmp_path / "tmp"  # the workers' spec.json lives here: their command lines name it
    worker_tmp.mkdir()
    env = os.environ | {"TMPDIR": str(worker_tmp)}
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "cpbench", *args], cwd=tmp_path, stdout=fo, stderr=fe,
                                env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while not (list(tmp_path.glob(state_glob)) and _processes_mentioning(f"{worker_tmp}/cpbench-N64-")):
            assert proc.poll() is None, f"cpbench ended before the signal: {err.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no probe state and running second point in time"
            time.sleep(0.05)
        os.kill(proc.pid, signum)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, out.read_text(), err.read_text(), worker_tmp


def _no_worker_left(worker_tmp: Path) -> None:
    deadline = time.monotonic() + 5  # SIGKILLed processes vanish from /proc after their reaping
    while _processes_mentioning(str(worker_tmp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(worker_tmp)) == []
    assert list(worker_tmp.iterdir()) == []  # the point's work dir was removed too


def test_ctrl_c_keeps_the_probe_state_and_prints_the_command_that_continues(tmp_path):
    run_dir = tmp_path / "run"
    code, stdout, stderr, worker_tmp = _interrupt(tmp_path, [*PROBE, f"hydra.run.dir={run_dir}"],
                                                  "run/probe_state.json", signal.SIGINT)
    assert code == 130, stderr
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpbench: interrupted by SIGINT: probe points N=32 fits"), stderr
    assert "resume=true" in lines[0] and f"hydra.run.dir={run_dir}" in lines[0]
    state = json.loads((run_dir / "probe_state.json").read_text())
    assert [p["N"] for p in state["points"]][:1] == [32]
    assert not (run_dir / "result.json").exists()
    _no_worker_left(worker_tmp)

    # The printed command continues the probe from its state (max_points=3: it ends soon).
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[:3] == ["python", "-m", "cpbench"]
    resumed = run_command([sys.executable, *command[1:]], tmp_path, timeout_s=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "probe: continuing from" in resumed.stdout + resumed.stderr
    record = json.loads((run_dir / "result.json").read_text())
    first = {k: v for k, v in state["points"][0].items() if k != "order"}
    assert record["points"][0] == first  # replayed from the state, not measured again


def test_sigterm_in_a_multirun_lists_the_points_not_started(tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, stdout, stderr, worker_tmp = _interrupt(
        tmp_path, ["-m", *PROBE, "S=4,8", f"hydra.sweep.dir={sweep_dir}", "report.out=null"],
        "sweep/0/probe_state.json", signal.SIGTERM)
    assert code == 143, stderr
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cpbench: interrupted by SIGTERM: 0 of 2 sweep points"), stderr
    assert "interrupted #0 (" in lines[0] and "S=4" in lines[0] and "not started #1 (" in lines[0]
    assert "-m " in lines[0] and "resume=true" in lines[0] and f"hydra.sweep.dir={sweep_dir}" in lines[0]
    json.loads((sweep_dir / "0" / "probe_state.json").read_text())
    _no_worker_left(worker_tmp)
