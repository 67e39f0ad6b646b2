"""Transient buffers of the sharded pair ops without autograd, on rank 0 of an emulated cp=2 group
(torch's fake process group, in its own process: the group is process-wide).

Near the memory limit a rank holds about two pair shards, so one more shard-sized buffer is what
moves the max N: the 1d transpose must land its received blocks in z's own storage (its only
shard-sized buffers are the channel-chunked send and receive buffers), and give what the
out-of-place transpose gives. The 1d triangle product writes each source rank's block straight
into its output view.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from cpbench.harness.emulation import init_fake_group
    from cpbench.models.pairformer.ops.triangle_product import _gathered_product_into
    from cpbench.models.pairformer.parallel import chunking
    from cpbench.models.pairformer.parallel.layout import ONE_D, Layout
    from cpbench.models.pairformer.parallel.transpose import _transpose_1d, transpose_pair

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numels = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if func._overloadname != "out" and name in ("empty", "empty_like", "empty_strided", "new_empty", "clone",
                                                         "zeros", "zeros_like", "mm", "bmm"):
                self.numels.append((name, out.numel()))
            return out

    init_fake_group(0, 2)
    layout = Layout(ONE_D, dist.group.WORLD, 0, 2)
    torch.manual_seed(0)
    z = torch.randn(16, 32, 8)
    expected = _transpose_1d(z.clone(), layout)
    work = z.clone()
    with torch.no_grad(), chunking.override_budget(z.numel() * z.element_size() // 4), Allocations() as seen:
        got = transpose_pair(work, layout)
    assert got.data_ptr() == work.data_ptr(), "the no-grad transpose returns z's own storage"
    assert torch.equal(got, expected), "in place and out of place disagree"
    big = [(name, n) for name, n in seen.numels if n >= z.numel()]
    assert not big, f"a shard-sized buffer in the no-grad transpose: {big}"

    left, right = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    out = torch.empty(4, 16, 32)
    with torch.no_grad(), Allocations() as seen:
        _gathered_product_into(out, left, right, layout)
    gathered = torch.cat([right, right], dim=1)  # the fake group: every peer sent this rank's rows
    assert torch.allclose(out, left @ gathered.transpose(1, 2), atol=1e-5)
    products = [n for name, n in seen.numels if name in ("mm", "bmm")]
    assert not products, f"the product went through a temporary: {products}"
    print("ok")
""")


def test_the_no_grad_1d_pair_ops_add_no_shard_sized_buffer():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
