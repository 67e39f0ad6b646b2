"""Where the training step's copy and add kernels come from: per dispatcher op, the autograd node that
ran it in the backward (or its cpbench stack frames in the forward), one profiled step of the boltz2
trunk at N tokens with B blocks, blocks-only checkpoints, the Triton passes (as ``scripts/profile_ops.py
train --variant compiled_triton_block``). A one-off, kept with its figures: run from the repository
root after ``docs/benchmarks/planned/script_env.sh`` as ``python3 <this file> N B OUT.json``."""
import collections
import json
import sys

import torch
from one_gpu import TRUNK_ONLY, one_rank_mesh, trunk_setup
from torch.profiler import ProfilerActivity, profile

n, blocks, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dev = torch.device("cuda", 0)
mesh = one_rank_mesh(dev, 29555)
wf = dict(TRUNK_ONLY, checkpointing=True, compile_training=True, passes="triton", checkpoint_ops=False)
adapter, model, batch = trunk_setup(n, blocks, "flex", mesh, dev, workflow=wf)
for _ in range(2):
    adapter.run_step(model, batch, True)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True, record_shapes=True) as prof:
    adapter.run_step(model, batch, True)
    torch.cuda.synchronize()
WATCH = ("aten::copy_", "aten::add", "aten::add_", "aten::cat", "aten::stack", "aten::clone", "aten::contiguous",
         "aten::fill_", "aten::zero_", "aten::sum", "aten::mul", "aten::index_put_", "aten::slice_scatter")
agg = collections.defaultdict(lambda: [0, 0.0])
for ev in prof.events():
    if ev.name not in WATCH:
        continue
    dus = sum(k.duration for k in ev.kernels) if ev.kernels else 0
    if not dus:
        continue
    # skip events whose parent is also a watched op (count the outermost only)
    p = ev.cpu_parent
    where = None
    while p is not None:
        if where is None and p.name.startswith("autograd::engine::evaluate_function"):
            where = p.name.split(": ", 1)[-1]
        p = p.cpu_parent
    frames = [f for f in (ev.stack or []) if "cpbench/" in f]
    if where is None:
        where = " < ".join(f.split("cpbench/")[-1] for f in frames[:2]) or "?"
    shape = str(ev.input_shapes[:2]) if ev.input_shapes else ""
    key = f"{ev.name} | {where} | {shape}"
    agg[key][0] += 1
    agg[key][1] += dus / 1e3
rows = sorted(({"op": k, "calls": v[0], "ms": round(v[1], 3)} for k, v in agg.items()), key=lambda r: -r["ms"])
json.dump(rows, open(out, "w"), indent=1)
for r in rows[:40]:
    print(r)
