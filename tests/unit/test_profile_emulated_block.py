"""``scripts/profile_ops.py block --cp K [--grid A B]``: rank 0's block of an emulated cp=K
trunk, timed op by op. Run as the script runs (its own process: the fake process group is
process-wide), on a CPU at a small N: the block gets the trunk's own shard of z under each
layout, and every op of the block is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPS = ["tri_mul_out", "tri_mul_in", "tri_att_start", "tri_att_end", "pair_transition", "single_attention",
       "single_transition"]


@pytest.mark.parametrize("cp, grid, local", [(2, None, [32, 64, 128]), (4, [2, 2], [32, 32, 128])])
def test_an_emulated_block_runs_on_this_ranks_shard(tmp_path, cp, grid, local):
    out = tmp_path / "block.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "profile_ops.py"), "block", "--device", "cpu", "--dtype", "fp32",
           "--n", "64", "--kernels", "torch", "--repeats", "1", "--warmup", "0", "--cp", str(cp), "--out", str(out)]
    cmd += ["--grid", *map(str, grid)] if grid else []
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    assert (row["cp"], row["mesh"], row["emulated"]) == (cp, grid or [cp], True)
    assert row["z_local_shape"] == local
    assert list(row["op_ms"]) == OPS and all(ms > 0 for ms in row["op_ms"].values())
    # the fills standing in for what the collectives write are timed apart, per op: the triangle
    # products' gathered operands (1d) and ring receives (2x2) are filled
    fills = row["emulation_fill_ms"]
    assert list(fills) == OPS and fills["tri_mul_out"] > 0 and fills["tri_mul_in"] > 0


def test_the_copy_tally_counts_one_copy_per_1d_transpose(tmp_path):
    """``--copies``: at this N the budget holds a whole shard, so each 1d transpose copies this
    rank's z once: the transpose back to Z rows (counted with the pair transition, which copies
    nothing itself) unpacks what landed and packs nothing; the one before the ending-node
    attention packs row-major z and unpacks nothing (its result is a view of what landed). Under
    emulation nothing fills a receive buffer (that pass is the link's, not the rank's)."""
    out = tmp_path / "block.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "profile_ops.py"), "block", "--device", "cpu", "--dtype", "fp32",
           "--n", "64", "--kernels", "torch", "--repeats", "1", "--warmup", "0", "--cp", "2", "--copies",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    table = row["copy_table"]
    assert list(table) == OPS + ["block"]
    assert table["pair_transition"]["z_shards"] == pytest.approx(1.0, abs=0.01)
    assert table["tri_att_end"]["by_op"]["copy_"] == pytest.approx(1.0, abs=0.1)  # the pack (into a new buffer)
    assert table["block"]["z_shards"] == pytest.approx(sum(table[op]["z_shards"] for op in OPS), abs=0.05)


def test_a_grid_that_is_not_the_cp_size_is_one_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "profile_ops.py"), "block", "--device", "cpu", "--cp", "4",
           "--grid", "2", "4"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--grid 2 4: cp0 x cp1 must be --cp=4" in done.stderr
