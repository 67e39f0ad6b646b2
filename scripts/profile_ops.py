"""Where the reference trunk's time goes, op by op and kernel by kernel, on one device.

    python scripts/profile_ops.py block --n 2048 --kernels flex torch [--kernel-rows 12] [--out FILE]
    python scripts/profile_ops.py train --n 2048 --blocks 2 --variant compiled [--lean] [--out FILE]
    python scripts/profile_ops.py passes --n 2048 --kernels flex flex+triton [--ncu PATH] [--out FILE]
    python scripts/profile_ops.py limits NCU_RAW.csv[.gz] [--out FILE]

Four modes; each prints one JSON line per measurement and writes them all to ``--out``. None
is a cpbench point (no harness, no ``result.json``): they say where a point's time goes.

``block`` (inference): one boltz2-sized Pairformer block (c_s 384, c_z 128, 4 triangle heads of
32, 16 single heads, transitions x4) at ``--n`` tokens, run as the trunk runs it (serial layout,
no autograd, each op on the pair the block hands it, transposes included, under the block's
agreed chunk budget as the trunk runs it: ``agreed_chunks``, agreed once a block, by its first op;
outside it every op took the near-limit path, e.g. the single attention's eager LayerNorm, until
2026-12-05, and until later that day each op of a sharded block made the agreement), under each backend
of ``--kernels`` in turn (``flex+triton``: ``flex`` with ``model.passes=triton``, the Triton passes
over z of ``ops/triton_passes.py``; ``flex+triton+tattn`` also ``model.attention=triton``).
``--warmup`` untimed blocks (the ``flex`` regions compile there), then
every op timed by a synchronized wall clock, median of ``--repeats`` blocks. Per backend:
``op_ms``, ``block_ms``, analytic TFLOP/s per op and for the block
(``cpbench.models.pairformer.flops``), ``peak_gib``, ``compile_s``; with ``--kernel-rows K`` one
more block runs under torch.profiler and ``kernel_table`` gives, per op, its GPU time, that time
by kernel kind and its K longest kernels. With ``--copies`` one more block runs under a dispatch
mode, and ``copy_table`` gives, per op, the bytes its copies, clones and fills write, in units of
this rank's z (a transpose counts with the op it feeds; ``--kernels torch`` only: the compiled
regions of ``flex`` do not run under a dispatch mode).

With ``--cp K`` (and ``--grid CP0 CP1`` for 2d) the block is rank 0's of an emulated cp=K trunk
(``emulate=true``'s fake process group: no peer's data arrives, the collectives' packing and
copies run; the collectives themselves and the fills that stand in for what they write are timed
apart, ``emulation_fill_ms`` per op, and left out of ``op_ms``, as the worker leaves them out of
a step): the inputs the
trunk hands its first block (this rank's shard of z) and its ops under that layout, so that
each op's per-rank time at cp=K sits beside its cp=1 time (which ops scale 1/K, which do not).
Its TFLOP/s are over a rank's 1/K share of the block's FLOPs.

``passes`` (CUDA, Nsight Compute): the same block, each backend in a child process under ``ncu``
(``--profile-from-start off``: the warmup block is not profiled; ncu flushes the L2 before each
kernel, so every kernel's reads come from DRAM), with a sentinel kernel (``torch.cuda._sleep``)
before each op. Per op: the kernels' DRAM bytes read and written (``dram__bytes_read.sum``,
``dram__bytes_write.sum``), their time (``gpu__time_duration.sum``, serialized, L2 cold) and the
equivalent passes over z, ``(read + written) / bytes of z``, per kernel too; and the block's total.
A block that reads and writes z once per op makes about 2 passes per op.

``limits`` (no GPU): what bounds each kernel of an Nsight Compute raw CSV with the compute, warp-state
and speed-of-light sections (``docs/benchmarks/planned/call_u.sh`` records one for triangle attention,
``call_v.sh`` for the Triton passes): issue slots used, the special-function (``xu``), tensor, FMA,
ALU and load/store pipes, warps per scheduler, the stall reasons in cycles per issued instruction,
largest first, and where the CSV has them the GB read and written in DRAM and moved through L2.

``train``: one training step (forward, backward, AdamW) of the boltz2 trunk (trunk only: no MSA
module, no recycling, no sampling) with ``--blocks`` blocks at ``--n`` tokens, cp=1, checkpointing
on. One ``--variant`` per process (the kernel selection is process-wide):

* ``eager``: ``kernels=torch`` ops under autograd (SDPA with the expanded bias), each block
  checkpointed with its ops checkpointed inside (``model.compile_training=false``);
* ``eager_block``: the same with only the block checkpointed (``model.checkpoint_ops=false``): what
  the nested checkpoints cost in recompute;
* ``compiled``: ``kernels=flex`` with ``compile_training=True`` (the default training path on CUDA);
* ``compiled_triton``: the same with ``model.passes=triton`` (the Triton passes and their Triton
  backward, ``ops/triton_backward.py``);
* ``compiled_block``, ``compiled_triton_block``: those two with only the block checkpointed
  (``model.checkpoint_ops=false``: each op's forward runs twice a step, not three times; the
  backward holds one block's activations).

``--lean`` runs the step under the lean chunk budgets of a probe's fitting point. Reported: the
first step (compilation included) and ``compile_s``, the median of ``--repeats`` further steps,
the adapter's stage times and stage peaks, and one profiled step's CUDA kernels, largest first,
with their time by kind (attention forward and backward, GEMM, LayerNorm, reductions, copies,
element-wise).

On a CPU (``--device cpu``, small ``--n``) both modes run (``--dtype fp32`` there: bf16 matmuls
are emulated on CPUs without bf16 units); the kernel tables and peaks need CUDA.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import statistics
import subprocess
import sys
import time

import torch
from one_gpu import TRUNK_ONLY, emulated_mesh, one_rank_mesh, trunk_setup
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from cpbench.models.fills import FILLS
from cpbench.models.pairformer.flops import PairformerSizes, block_flops
from cpbench.models.pairformer.modules.block import PairformerBlock, chunk_context
from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.parallel.layout import Layout, serial_layout
from cpbench.models.pairformer.parallel.transpose import transpose_pair

SIZES = dict(c_s=384, c_z=128, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# the block's ops in the order the trunk runs them, and their names in flops.BLOCK_OPS
OP_FLOPS = {"tri_mul_out": "triangle_mult_out", "tri_mul_in": "triangle_mult_in",
            "tri_att_start": "triangle_att_start", "tri_att_end": "triangle_att_end",
            "pair_transition": "pair_transition", "single_attention": "single_att_pair_bias",
            "single_transition": "single_transition"}
# Kernel name patterns, first match wins: the kinds a profile's CUDA time is grouped by.
KINDS = (
    ("triton_pass", r"(_norm_linear_kernel|_triangle_operands_kernel|_triangle_update_kernel|_gated_output_kernel"
                    r"|_swiglu_kernel)"),  # ops/triton_passes.py
    ("triton_pass_backward", r"^_(norm_linear|triangle_operands|triangle_update|gated_output|swiglu)_bwd"),
    # ops/triton_backward.py
    ("attention_backward", r"(cutlassB|attention_backward|AttentionBackward|_bwd|flex_attention_backward|dq_dk|dkdv)"),
    ("attention_forward", r"(?i)(fmha|flash|attention|cudnn.*sdpa|flex|triton_tem_fused)"),
    ("gemm", r"(?i)(gemm|cutlass|sm90_xmma|nvjet|cublas|matmul|ampere_.*_s16816)"),
    ("layer_norm", r"(?i)(layer_norm|layernorm)"),
    ("reduce", r"(?i)(reduce|sum_|_sum|red_)"),
    ("copy", r"(?i)(copy|cat|transpose|memcpy|memset|fill)"),
    ("elementwise", r"(?i)(elementwise|vectorized|triton_poi|triton_per|triton_red|unrolled)"),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "other")


def kernel_rows(prof) -> list[dict]:
    """The CUDA kernels of a profiled region: name, calls, total ms, kind (largest first)."""
    rows = []
    for ev in prof.key_averages():
        device_us = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if device_us and ev.device_type == torch.autograd.DeviceType.CUDA:
            rows.append(dict(name=ev.key[:120], calls=ev.count, ms=round(device_us / 1e3, 3), kind=kind_of(ev.key)))
    return sorted(rows, key=lambda r: -r["ms"])


def ms_by_kind(rows: list[dict]) -> dict[str, float]:
    by_kind: dict[str, float] = {}
    for r in rows:
        by_kind[r["kind"]] = round(by_kind.get(r["kind"], 0.0) + r["ms"], 2)
    return dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))


def _tflops(flop: float, ms: float) -> float:
    return float(f"{flop / ms / 1e9:.3g}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _now_ms(device: torch.device) -> float:
    _sync(device)
    return time.perf_counter() * 1e3


def _block_ops(block: PairformerBlock, mask: torch.Tensor, layout: Layout | None = None) -> list:
    """``(name, op)`` per op of the block; ``op(s, z) -> (s, z)``, the pair as the trunk hands it on
    (this rank's shard of it under ``layout``: serial by default), under the block's agreed chunk
    budget as the trunk runs it (``agreed_chunks``)."""
    layout = layout if layout is not None else serial_layout()
    context: dict = {}  # the block's chunk context, decided by its first op (one agreement a block)

    def in_block(op, first: bool):
        def run(s: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if first:
                context["enter"] = chunk_context(z, layout)
            with context["enter"]():
                return op(s, z)
        return run

    return [(name, in_block(op, first=name == "tri_mul_out")) for name, op in [
        ("tri_mul_out", lambda s, z: (s, block.tri_mul_out(z, mask, layout))),
        ("tri_mul_in", lambda s, z: (s, block.tri_mul_in(transpose_pair(z, layout), mask, layout))),
        ("tri_att_start", lambda s, z: (s, block.tri_att_start(transpose_pair(z, layout), mask, layout))),
        ("tri_att_end", lambda s, z: (s, block.tri_att_end(transpose_pair(z, layout), mask, layout))),
        ("pair_transition", lambda s, z: (s, transpose_pair(block.pair_transition(z), layout))),
        ("single_attention", lambda s, z: (block.attention(s, z, mask, layout), z)),
        ("single_transition", lambda s, z: (block.single_transition(s), z)),
    ]]


def _kernel_table(ops: list, s: torch.Tensor, z: torch.Tensor, top: int) -> dict[str, dict]:
    """One more block under torch.profiler: per op its GPU ms, by kind, and its ``top`` longest kernels."""
    table = {}
    for name, op in ops:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            s, z = op(s, z)
            torch.cuda.synchronize()
        rows = kernel_rows(prof)
        table[name] = {"gpu_ms": round(sum(r["ms"] for r in rows), 3), "by_kind": ms_by_kind(rows), "top": rows[:top]}
    return table


# The dispatcher ops that only move data: what ``--copies`` counts (their outputs' bytes).
COPY_OPS = ("copy_", "clone", "cat", "fill_", "zero_", "contiguous", "_to_copy", "index_put_", "slice_scatter")


class _CopyTally(TorchDispatchMode):
    """Bytes written by data-moving ops (``COPY_OPS``), per op name, while active."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        first = out[0] if isinstance(out, (list, tuple)) and out else out
        if name in COPY_OPS and torch.is_tensor(first):
            self.bytes[name] = self.bytes.get(name, 0) + first.numel() * first.element_size()
        return out


def _copy_table(ops: list, s: torch.Tensor, z: torch.Tensor) -> dict[str, dict]:
    """One more block under ``_CopyTally``: per op, the bytes its copies, clones and fills write, in
    units of this rank's z (``z_shards``), by dispatcher op. Transposes count with the op they feed."""
    z_bytes = z.numel() * z.element_size()
    table = {}
    for name, op in ops:
        with _CopyTally() as tally:
            s, z = op(s, z)
        table[name] = {"z_shards": round(sum(tally.bytes.values()) / z_bytes, 2),
                       "by_op": {k: round(v / z_bytes, 2) for k, v in sorted(tally.bytes.items())}}
    table["block"] = {"z_shards": round(sum(v["z_shards"] for v in table.values()), 2)}
    return table


def _block_setup(n_tokens: int, backend: str, device: torch.device, dtype: str) -> tuple:
    """``(s, z, ops)`` of one block at ``n_tokens`` under ``backend`` (a label: ``flex+triton`` is
    ``flex`` with ``model.passes=triton``, ``+tattn`` adds ``model.attention=triton``;
    ``kernels.choices_of``), weights and inputs from seed 0."""
    kernels.select_label(backend, device)
    torch.manual_seed(0)
    block = PairformerBlock(**SIZES).to(device, DTYPES[dtype])
    z = torch.randn(n_tokens, n_tokens, SIZES["c_z"], device=device, dtype=DTYPES[dtype])
    s = torch.randn(n_tokens, SIZES["c_s"], device=device, dtype=DTYPES[dtype])
    return s, z, _block_ops(block, torch.ones(n_tokens, dtype=torch.bool, device=device))


def _emulated_block_setup(n_tokens: int, backend: str, mesh, device: torch.device, dtype: str) -> tuple:
    """``(s, z, ops)`` of rank 0's first block of the trunk-only boltz2 pass on ``mesh`` (a cp=K
    group over the fake process group, ``one_gpu.emulated_mesh``): the inputs the trunk hands
    that block (its shard of z, its s), caught by a forward pre-hook in one inference step of a
    one-block trunk under ``backend``, and the block's ops under that step's layout."""
    choices = kernels.choices_of(backend)
    adapter, model, batch = trunk_setup(n_tokens, 1, choices["kernels"], mesh, device, dtype,
                                        passes=choices["passes"], attention=choices["attention"])
    block = next(m for m in model.modules() if isinstance(m, PairformerBlock))
    caught: dict = {}

    def catch(_module, args):
        caught.setdefault("args", [a.clone() if torch.is_tensor(a) else a for a in args])

    handle = block.register_forward_pre_hook(catch)
    with torch.no_grad():
        adapter.run_step(model, batch, train=False)
    handle.remove()
    s, z, mask, layout = caught["args"][:4]
    return s, z, _block_ops(block, mask, layout)


def profile_block(n_tokens: int, backend: str, warmup: int, repeats: int, device: torch.device,
                  dtype: str = "bf16", kernel_rows_per_op: int = 0, mesh=None, copies: bool = False) -> dict:
    """Median ms per op of one block at ``n_tokens`` under ``backend`` (module docstring: ``block``;
    ``flex+triton``: ``flex`` with ``model.passes=triton``); with ``mesh`` (``--cp``), rank 0's
    ops of an emulated cp=K block."""
    backend_name = backend
    cp = mesh.size() if mesh is not None else 1
    s, z, ops = (_emulated_block_setup(n_tokens, backend, mesh, device, dtype) if mesh is not None
                 else _block_setup(n_tokens, backend, device, dtype))
    times: dict[str, list[float]] = {name: [] for name, _ in ops}
    fills: dict[str, list[float]] = {name: [] for name, _ in ops}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        for rep in range(warmup + repeats):
            for name, op in ops:
                start_ms = _now_ms(device)
                FILLS.take_ms()
                s, z = op(s, z)
                elapsed_ms = _now_ms(device) - start_ms
                # emulated: the fills that stand in for the collectives' writes are not this rank's
                # compute (cpbench.models.fills); the worker takes them out of a step the same way
                filled_ms = FILLS.take_ms()
                if rep >= warmup:
                    times[name].append(elapsed_ms - filled_ms)
                    fills[name].append(filled_ms)
        table = _kernel_table(ops, s, z, kernel_rows_per_op) if kernel_rows_per_op and cuda else None
        copy_table = _copy_table(ops, s, z) if copies else None
    op_ms = {name: round(statistics.median(t), 3) for name, t in times.items()}
    flops = block_flops(n_tokens, PairformerSizes(**SIZES))  # a rank's share: 1/cp of it, ideally
    tflops = {name: _tflops(flops[OP_FLOPS[name]] / cp, ms) for name, ms in op_ms.items() if ms > 0}
    block_ms = round(sum(op_ms.values()), 3)
    where = {"cp": cp, "mesh": list(mesh.shape) if mesh is not None else [1], "emulated": mesh is not None,
             "z_local_shape": list(z.shape)}
    return {"mode": "block", "kernels": backend_name, "N": n_tokens, "dtype": dtype, "device": str(device), **where,
            "op_ms": op_ms, "block_ms": block_ms, "op_tflops_per_s": tflops,
            "emulation_fill_ms": {name: round(statistics.median(t), 3) for name, t in fills.items()}
            if mesh is not None else None,
            "block_tflops_per_s": _tflops(flops["block"] / cp, block_ms),
            "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
            "compile_s": round(kernels.compile_seconds(), 1), "kernel_table": table, "copy_table": copy_table}


# ---------------------------------------------------------------- passes: bytes per kernel (ncu)

NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
SENTINEL = "spin_kernel"  # torch.cuda._sleep's kernel, launched before each op: it splits ncu's kernel list
CHILD_TAG = "profile_ops passes-child: "


def passes_child(n_tokens: int, backend: str, warmup: int, device: torch.device, dtype: str) -> None:
    """Under ``ncu --profile-from-start off``: ``warmup`` untimed blocks, then one block inside
    ``cudaProfilerStart/Stop`` with a sentinel kernel before each op and after the last; prints
    the op names and the size of z (``CHILD_TAG``)."""
    s, z, ops = _block_setup(n_tokens, backend, device, dtype)
    with torch.no_grad():
        for _ in range(warmup):
            for _, op in ops:
                s, z = op(s, z)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.start()
        for _, op in ops:
            torch.cuda._sleep(1000)
            s, z = op(s, z)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize(device)
        torch.cuda.profiler.stop()
    print(CHILD_TAG + json.dumps({"ops": [name for name, _ in ops], "z_bytes": z.numel() * z.element_size()}),
          flush=True)


def _ncu_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows after it of ``ncu --csv`` output (its quoted lines; the program's
    own lines skipped)."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    start = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if start is None:
        raise ValueError("no ncu CSV header (a 'Kernel Name' column) in the output")
    return rows[start], rows[start + 1:]


def parse_ncu_csv(text: str, metrics: tuple[str, ...] = NCU_METRICS) -> list[dict]:
    """The kernels of ``ncu --csv --page raw --print-units base`` output, in launch order:
    ``{"name", <metric>: float}`` for each of ``metrics`` present (bytes, nanoseconds, percent);
    the program's own lines and ncu's units row are skipped."""
    header, rows = _ncu_table(text)
    kernels_found = []
    for row in rows:
        rec = dict(zip(header, row))
        if len(row) != len(header) or not rec.get("ID", "").strip().isdigit():
            continue  # the units row, or a line that is not a kernel
        kernels_found.append({"name": rec["Kernel Name"],
                              **{m: float(rec[m].replace(",", "") or "nan") for m in metrics if m in rec}})
    return kernels_found


# What bounds a kernel (``limits``): issue slots, the pipes that compete for them, and each warp's stall
# reasons (cycles stalled per issued instruction)
LIMIT_METRICS = ("gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
                 "smsp__warps_active.avg.per_cycle_active", "launch__registers_per_thread",
                 "dram__cycles_active.avg.pct_of_peak_sustained_elapsed", "lts__throughput.avg.pct_of_peak_sustained_elapsed")
# Bytes a kernel moves, in GB where the CSV has them (ncu --metrics, docs/benchmarks/planned/call_v.sh):
# DRAM against the L2's traffic from the SMs (a kernel that re-reads its weights per tile moves far
# more through L2 than from DRAM)
BYTE_METRICS = {"dram__bytes_read.sum": "dram_read_gb", "dram__bytes_write.sum": "dram_write_gb",
                "lts__t_bytes.sum": "l2_gb"}
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def kernel_limits(text: str) -> list[dict]:
    """Per kernel name (its last launch) of an ncu raw CSV with the ComputeWorkloadAnalysis,
    WarpStateStats and SpeedOfLight sections (``docs/benchmarks/planned/call_u.sh``): ``LIMIT_METRICS``
    under short names, and the stall reasons, largest first."""
    stalls = tuple(h for h in _ncu_table(text)[0] if h.startswith(STALL_PREFIX) and h.endswith(STALL_SUFFIX))
    last = {k["name"]: k for k in parse_ncu_csv(text, LIMIT_METRICS + tuple(BYTE_METRICS) + stalls)}
    out = []
    for name, k in last.items():
        row = {"kernel": name[:60], "ms": round(k["gpu__time_duration.sum"] / 1e6, 3)}
        row.update({m.split(".")[0]: round(k[m], 2) for m in LIMIT_METRICS[1:] if m in k})
        row.update({short: round(k[m] / 1e9, 3) for m, short in BYTE_METRICS.items() if m in k})
        stall = {h[len(STALL_PREFIX):-len(STALL_SUFFIX)]: round(k[h], 2) for h in stalls if k.get(h, 0) >= 0.05}
        row["stalls_per_issue"] = dict(sorted(stall.items(), key=lambda kv: -kv[1]))
        out.append(row)
    return out


def passes_per_op(kernel_list: list[dict], ops: list[str], z_bytes: int) -> dict:
    """Per op (the kernels between consecutive sentinels): bytes read and written, kernel ms, and
    equivalent passes over z (``(read + written) / z_bytes``), with each kernel's; and the block's."""
    groups: list[list[dict]] = []
    for k in kernel_list:
        if SENTINEL in k["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(k)
    groups = groups[:len(ops)]  # the last sentinel closes the last op
    if len(groups) != len(ops):
        raise ValueError(f"{len(groups)} sentinel-delimited groups of kernels for {len(ops)} ops")
    per_op = {}
    for name, group in zip(ops, groups):
        read = sum(k.get("dram__bytes_read.sum", 0.0) for k in group)
        written = sum(k.get("dram__bytes_write.sum", 0.0) for k in group)
        per_op[name] = {
            "kernels": len(group), "read_gb": round(read / 1e9, 3), "written_gb": round(written / 1e9, 3),
            "kernel_ms": round(sum(k.get("gpu__time_duration.sum", 0.0) for k in group) / 1e6, 3),
            "passes": round((read + written) / z_bytes, 2),
            "by_kernel": [{"name": k["name"][:80], "passes": round((k.get("dram__bytes_read.sum", 0.0)
                                                                   + k.get("dram__bytes_write.sum", 0.0)) / z_bytes, 2),
                           "ms": round(k.get("gpu__time_duration.sum", 0.0) / 1e6, 3)} for k in group]}
    return {"z_gb": round(z_bytes / 1e9, 3), "ops": per_op,
            "block_passes": round(sum(op["passes"] for op in per_op.values()), 1),
            "block_kernel_ms": round(sum(op["kernel_ms"] for op in per_op.values()), 3)}


def profile_passes(n_tokens: int, backend: str, warmup: int, dtype: str, ncu: str) -> dict:
    """One block under Nsight Compute (``ncu``, which replays each kernel with the L2 flushed
    before it, so every read comes from DRAM): ``passes_per_op`` for ``backend``."""
    cmd = [ncu, "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base",
           "--metrics", ",".join(NCU_METRICS), sys.executable, __file__, "passes-child", "--n", str(n_tokens),
           "--kernels", backend, "--warmup", str(warmup), "--dtype", dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    tagged = [line for line in proc.stdout.splitlines() if line.startswith(CHILD_TAG)]
    if proc.returncode != 0 or not tagged:
        raise RuntimeError(f"{' '.join(cmd[:9])} ... failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    child = json.loads(tagged[-1][len(CHILD_TAG):])
    return {"mode": "passes", "kernels": backend, "N": n_tokens, "dtype": dtype,
            "metrics": list(NCU_METRICS), **passes_per_op(parse_ncu_csv(proc.stdout), child["ops"], child["z_bytes"])}


def profile_training(n_tokens: int, blocks: int, variant: str, repeats: int, lean: bool, device: torch.device,
                     dtype: str = "bf16", port: int = 29533) -> dict:
    """Training steps of the trunk at ``n_tokens`` under ``variant`` (module docstring: ``train``)."""
    mesh = one_rank_mesh(device, port)
    compiled = variant.startswith("compiled")
    workflow = dict(TRUNK_ONLY, checkpointing=True, compile_training=compiled,
                    passes="triton" if variant.startswith("compiled_triton") else "inductor",
                    checkpoint_ops=not variant.endswith("_block"))  # _block: model.checkpoint_ops=false
    backend = "flex" if compiled else "torch"
    adapter, model, batch = trunk_setup(n_tokens, blocks, backend, mesh, device, dtype=dtype, workflow=workflow)
    row = dict(mode="train", variant=variant, N=n_tokens, blocks=blocks, lean=lean, dtype=dtype,
               device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", torch=torch.__version__)

    def step() -> float:
        _sync(device)
        t0 = time.perf_counter()
        adapter.run_step(model, batch, True, lean=lean)
        _sync(device)
        return time.perf_counter() - t0

    row["first_step_s"] = round(step(), 3)
    row["compile_s"] = round(kernels.compile_seconds(), 2)
    times = [step() for _ in range(repeats)]
    row["step_s"] = [round(t, 3) for t in times]
    row["median_step_s"] = round(statistics.median(times), 3)
    stats = adapter.stats()
    row["stage_ms"], row["kernels_ran"] = stats["stage_ms"], stats["kernels"]
    # the adapter's stage timer resets the allocator's peak per stage, so max_memory_allocated
    # after a step holds only its last stage's: the step's peak is the largest stage peak
    stage_peaks = stats.get("stage_peak_gib") or {}
    if stage_peaks:
        row["peak_gib"], row["stage_peak_gib"] = max(stage_peaks.values()), stage_peaks
    if device.type == "cuda":
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            adapter.run_step(model, batch, True, lean=lean)
            _sync(device)
        rows = kernel_rows(prof)
        row["kernel_ms_by_kind"] = ms_by_kind(rows)
        row["kernel_ms_total"] = round(sum(r["ms"] for r in rows), 1)
        row["top_kernels"] = rows[:25]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = p.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--n", type=int, default=2048, help="tokens")
    common.add_argument("--repeats", type=int, default=5)
    common.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    common.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    common.add_argument("--out", default=None, help="write every line, as a JSON list, here")
    blk = modes.add_parser("block", parents=[common], help="one block's ops, inference, per backend")
    blk.add_argument("--kernels", nargs="+", default=["flex", "torch"])
    blk.add_argument("--warmup", type=int, default=2)
    blk.add_argument("--kernel-rows", type=int, default=0, help="profile one more block: K longest kernels per op")
    blk.add_argument("--cp", type=int, default=1, help="rank 0 of an emulated cp=K block (fake process group)")
    blk.add_argument("--grid", type=int, nargs=2, default=None, metavar=("CP0", "CP1"),
                     help="with --cp: the 2d grid (cp0 x cp1 = cp); default 1d")
    blk.add_argument("--copies", action="store_true",
                     help="one more block: per op, the bytes its copies, clones and fills write, in z-shards")
    pas = modes.add_parser("passes", parents=[common], help="one block's bytes per kernel under ncu, per backend")
    pas.add_argument("--kernels", nargs="+", default=["flex", "flex+triton"])
    pas.add_argument("--warmup", type=int, default=1)
    pas.add_argument("--ncu", default="ncu", help="Nsight Compute's command line")
    child = modes.add_parser("passes-child", parents=[common], help="(run by passes, under ncu)")
    child.add_argument("--kernels", nargs=1, required=True)
    child.add_argument("--warmup", type=int, default=1)
    lim = modes.add_parser("limits", help="what bounds each kernel of an ncu raw CSV (docs/benchmarks/planned/call_u.sh), no GPU")
    lim.add_argument("csv", help="ncu --csv --page raw --print-units base output (.gz too)")
    lim.add_argument("--out", default=None)
    trn = modes.add_parser("train", parents=[common], help="one training step of the trunk")
    trn.add_argument("--blocks", type=int, default=2)
    trn.add_argument("--variant", default="compiled",
                     choices=("eager", "eager_block", "compiled", "compiled_block", "compiled_triton", "compiled_triton_block"))
    trn.add_argument("--lean", action="store_true", help="lean chunk budgets (what a probe's fitting point runs)")
    trn.add_argument("--port", type=int, default=29533)
    trn.set_defaults(repeats=2)
    args = p.parse_args()
    if args.mode == "limits":
        opener = gzip.open if args.csv.endswith(".gz") else open
        with opener(args.csv, "rt") as f:
            rows = kernel_limits(f.read())
        for row in rows:
            print(json.dumps(row))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
        return
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if args.mode == "passes-child":
        passes_child(args.n, args.kernels[0], args.warmup, device, args.dtype)
        return
    if args.mode == "passes":
        runs = [lambda backend=backend: profile_passes(args.n, backend, args.warmup, args.dtype, args.ncu)
                for backend in args.kernels]
    elif args.mode == "block":
        if args.copies and set(args.kernels) != {"torch"}:
            p.error("--copies: with --kernels torch only (compiled regions do not run under its dispatch mode)")
        if args.grid is not None and args.grid[0] * args.grid[1] != args.cp:
            p.error(f"--grid {args.grid[0]} {args.grid[1]}: cp0 x cp1 must be --cp={args.cp}")
        mesh = emulated_mesh(device, args.cp, args.grid) if args.cp > 1 else None
        runs = [lambda backend=backend: profile_block(args.n, backend, args.warmup, args.repeats, device,
                                                      args.dtype, args.kernel_rows, mesh, args.copies)
                for backend in args.kernels]
    else:
        runs = [lambda: profile_training(args.n, args.blocks, args.variant, args.repeats, args.lean, device,
                                         args.dtype, args.port)]
    rows = []
    for run in runs:
        rows.append(run())
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
