"""GPU parity of the kernel backends: ``flex`` (and ``cueq`` where it imports) against ``torch``.

    python scripts/kernel_parity.py [--n 256] [--out FILE]

One Pairformer block and the whole trunk (boltz2 widths, 4 blocks: the depth does not change
what is compared), fresh random weights and inputs at N tokens, cp=1, in fp32 and bf16: the
inference outputs, and for the training path (checkpointed trunk, the block with autograd) the
outputs and every parameter gradient, each reported as a norm-wise relative error against the
``torch`` backend. Prints one JSON line per
comparison and writes them all to ``--out``. Tolerances: fp32 1e-3 (TF32 matmuls and a different
softmax order), bf16 5e-2 (bf16 rounding of every activation, over 4 blocks and a recycle).
``flex+triton`` is ``flex`` with ``model.passes=triton`` (the Triton passes over z,
``ops/triton_passes.py``; in training with their Triton backward, ``ops/triton_backward.py``),
``flex+triton+tattn`` also ``model.attention=triton`` (the Triton triangle attention,
``ops/triton_attention.py``, inference only: its training path runs FlexAttention).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cpbench.models.pairformer.adapter import PairformerAdapter, trunk_loss
from cpbench.models.pairformer.modules.block import PairformerBlock
from cpbench.models.pairformer.ops import kernels
from cpbench.models.pairformer.parallel.layout import serial_layout

TOL = {"fp32": 1e-3, "bf16": 5e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SIZES = dict(c_s=384, c_z=128, blocks=4, heads_single=16, heads_tri=4, head_dim_tri=32, transition_factor=4,
             c_atom=128, c_atompair=16, atom_blocks=3, atom_heads=4, c_m=64, msa_blocks=1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def block_run(backend: str, dtype: str, n: int, seed: int) -> dict:
    kernels.select_label(backend, torch.device("cuda"))
    torch.manual_seed(seed)
    block = PairformerBlock(384, 128, 16, 4, 32, 4).cuda().to(DTYPES[dtype])
    s = torch.randn(n, 384, device="cuda", dtype=DTYPES[dtype])
    z = torch.randn(n, n, 128, device="cuda", dtype=DTYPES[dtype])
    mask = torch.arange(n, device="cuda") < n - 7  # a few padded tokens
    with torch.no_grad():
        s_inf, z_inf = block(s.clone(), z.clone(), mask, serial_layout())
    s, z = s.requires_grad_(), z.requires_grad_()
    s_out, z_out = block(s, z, mask, serial_layout())
    (s_out.float().square().mean() + z_out.float().square().mean()).backward()
    return {"s_inference": s_inf, "z_inference": z_inf, "s": s_out.detach(), "z": z_out.detach(),
            "grad_s": s.grad, "grad_z": z.grad, **{f"grad/{k}": p.grad for k, p in block.named_parameters()}}


def trunk_run(backend: str, dtype: str, n: int, seed: int) -> dict:
    choices = kernels.select_label(backend, torch.device("cuda"))
    adapter = PairformerAdapter(**SIZES, dtype=dtype, **choices)
    torch.manual_seed(seed)
    model = adapter.build_model(None, torch.device("cuda"))
    torch.manual_seed(seed + 1)
    batch = adapter.build_batch(n, 8 * n, 16, None, torch.device("cuda"))
    with torch.no_grad():
        s_inf, z_inf = model(batch, model.layout, recycles=1)
    s, z = model(batch, model.layout, checkpointing=True)
    trunk_loss(s, z, batch["token_mask"], model.layout).backward()
    return {"s_inference": s_inf, "z_inference": z_inf, "s": s.detach(), "z": z.detach(),
            **{f"grad/{k}": p.grad for k, p in model.named_parameters() if p.grad is not None}}


def compare(what: str, run, backend: str, dtype: str, n: int, seed: int) -> dict:
    kernels.compile_training(True)  # the training path under test is the compiled one
    ref = run("torch", dtype, n, seed)
    start = time.perf_counter()
    got = run(backend, dtype, n, seed)
    worst = max(((k, rel(got[k], ref[k])) for k in got), key=lambda kv: kv[1])
    outputs = {k: rel(got[k], ref[k]) for k in got if not k.startswith("grad/")}
    grads = sorted(rel(got[k], ref[k]) for k in got if k.startswith("grad/"))
    return {"what": what, "backend": backend, "dtype": dtype, "N": n, "seed": seed, "outputs": outputs,
            "params_compared": len(grads), "param_grad_median_rel": grads[len(grads) // 2] if grads else None,
            "worst": worst[0], "worst_rel": worst[1],
            "tol": TOL[dtype], "ok": worst[1] <= TOL[dtype], "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--out", default=None)
    parser.add_argument("--backends", nargs="+", default=None,
                        help="default: flex, flex+triton, flex+triton+tattn and cueq where it imports")
    args = parser.parse_args()
    backends = args.backends or ["flex", "flex+triton", "flex+triton+tattn"] + (["cueq"] if _cueq_available() else [])
    lines = []
    for backend in backends:
        for dtype in ("fp32", "bf16"):
            for what, run in (("block", block_run), ("trunk", trunk_run)):
                line = compare(what, run, backend, dtype, args.n, seed=1234)
                print(json.dumps(line), flush=True)
                lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": lines}, f, indent=1)


def _cueq_available() -> bool:
    try:
        kernels.resolve("cueq", torch.device("cuda"))
    except kernels.KernelError:
        return False
    return True


if __name__ == "__main__":
    main()
