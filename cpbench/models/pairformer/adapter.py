"""The benchmark adapter of the reference trunk (protocol: ``cpbench/models/api.py``).

Example::

    adapter = PairformerAdapter(c_s=32, c_z=16, blocks=2, heads_single=4, heads_tri=2,
                                head_dim_tri=8, transition_factor=4, dtype="fp32")
    model = adapter.build_model(mesh, device)          # same global weights at every cp
    batch = adapter.build_batch(N, n_atoms, S, mesh, device)
    loss = adapter.run_step(model, batch, train=True)  # global loss, same on every rank

Weights are created on the CPU from torch's global RNG (the harness seeds it identically on
every rank), so every rank and every cp builds the same global weights; the features are global
and O(N) (each rank keeps them whole: the pair init is computed for its own rows only).
Training: AdamW, parameter gradients all-reduced (summed) over the CP group in one flat buffer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cpbench.data.sharding import pad_features
from cpbench.data.synthetic import MSA_KEYS, make_synthetic_features
from cpbench.models import dtypes
from cpbench.models.pairformer.modules.cuda_graphs import GraphedBlocks, GraphedDenoiser
from cpbench.models.pairformer.modules.diffusion import BOLTZ2_SIZES, DiffusionModule
from cpbench.models.pairformer.modules.sampler import sample
from cpbench.models.pairformer.modules.trunk import PairformerTrunk
from cpbench.models.pairformer.ops import kernels as ops_kernels
from cpbench.models.pairformer.ops import sdpa_lse
from cpbench.models.pairformer.parallel import chunking, comm
from cpbench.models.pairformer.parallel.layout import Layout, layout_from_mesh
from cpbench.models.pairformer.parallel.padding import token_multiple
from cpbench.models.pairformer.stage_timer import StageTimer, now_s

# Recycling passes a probe step runs (``run_blocks`` set) besides the last: none. Without
# autograd every pass writes the pair init into the same z in place (``PairformerTrunk._recycle``)
# and then runs the same ops, so each pass repeats the first's allocations (the probe's depth
# check still compares against the full step, all passes); on the tiny CPU preset each pass was
# a third of the quick start's time, and a near-limit H200 point with sampling took ~300 s in two.
PROBE_RECYCLES = 0
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def trunk_loss(s: torch.Tensor, z: torch.Tensor, token_mask: torch.Tensor, layout: Layout) -> torch.Tensor:
    """This rank's share of the global loss ``mean(z²) + mean(s²)`` over real pairs / tokens.

    Args: ``s: [N/P, c_s]``, ``z: [N/P, N, c_z]``, ``token_mask: [N]``.
    Returns: fp32 scalar; the sum over ranks is the global loss.
    """
    rows, cols = layout.rows(token_mask.shape[0]), layout.cols(token_mask.shape[0])  # 2d: a tile
    m = token_mask.to(torch.float32)
    n_real = m.sum()
    pair_sq = z.square().sum(-1, dtype=torch.float32)  # [N/P, N]
    z_term = (pair_sq * m[rows, None] * m[None, cols]).sum() / (n_real * n_real * z.shape[-1])
    s_term = (s.square().sum(-1, dtype=torch.float32) * m[rows]).sum() / (n_real * s.shape[-1])
    # 2d: s is replicated over the grid row; one rank of the row counts it (0·s elsewhere keeps
    # the collectives of the single track in every rank's backward).
    return z_term + s_term if layout.owns_single else z_term + 0 * s_term


def all_reduce_grads(model: nn.Module, layout: Layout) -> None:
    """Sum parameter gradients over the CP group (one flat all-reduce)."""
    if not layout.sharded:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce_(flat, layout)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _outputs_finite(s: torch.Tensor, z: torch.Tensor) -> bool:
    """Whether the trunk's outputs are finite: one fp32 sum per tensor (a reduction allocates
    nothing of z's size, and any inf or NaN makes the sum non-finite); the worker fails a step
    whose outputs are not (``harness.worker.check_finite``). On every run, real or emulated: under
    emulation a receive buffer left unfilled would show here, and on one H200 a CUDA LayerNorm
    past 2**32 elements made a near-limit step NaN (``ops/layer_norm.py``)."""
    return all(bool(torch.isfinite(t.sum(dtype=torch.float32))) for t in (s, z))


def _heaviest(blocks: list[dict]) -> dict:
    """The per-kind counts of the block that sent the most bytes ({} without a sharded block)."""
    return max(blocks, key=lambda b: sum(v["bytes"] for v in b.values()), default={})


class PairformerAdapter:
    """Hydra target of ``model=pairformer|boltz2|af3|tiny`` (``cpbench/conf/model/``)."""

    def __init__(self, c_s: int = 384, c_z: int = 128, blocks: int = 64, heads_single: int = 16,
                 heads_tri: int = 4, head_dim_tri: int = 32, transition_factor: int = 4,
                 dtype: str = "bf16", recycles: int = 0, checkpointing: bool = False, lr: float = 1e-4,
                 c_atom: int = 128, c_atompair: int = 16, atom_blocks: int = 3, atom_heads: int = 4,
                 c_m: int = 64, msa_blocks: int = 4, sampling: bool = False, sampling_steps: int = 200,
                 samples: int = 5, diffusion: dict | None = None, kernels: str = "auto",
                 compile_training: bool = True, cuda_graphs: bool = False, passes: str = "inductor",
                 attention: str = "auto", checkpoint_ops: bool = True) -> None:
        if dtype not in TORCH_DTYPES and dtype != "auto":
            raise ValueError(f"dtype={dtype!r}: allowed auto, {', '.join(sorted(TORCH_DTYPES))}")
        self.sizes = dict(c_s=c_s, c_z=c_z, blocks=blocks, heads_single=heads_single, heads_tri=heads_tri,
                          head_dim_tri=head_dim_tri, transition_factor=transition_factor)
        self.sizes.update(c_atom=c_atom, c_atompair=c_atompair, atom_blocks=atom_blocks, atom_heads=atom_heads,
                          c_m=c_m, msa_blocks=msa_blocks)  # atom encoder, MSA module
        self.dtype_name = dtype  # "auto" resolves on the device (build_model: cpbench.models.dtypes)
        self.recycles, self.checkpointing, self.lr = int(recycles), bool(checkpointing), float(lr)
        self.checkpoint_ops = bool(checkpoint_ops)  # with checkpointing: each op too, inside the block's recompute
        # Diffusion sampling after the trunk (inference only; ``diffusion.DiffusionModule`` sizes).
        self.sampling, self.sampling_steps, self.samples = bool(sampling), int(sampling_steps), int(samples)
        if self.sampling and (self.sampling_steps < 1 or self.samples < 1):
            raise ValueError(f"sampling_steps={sampling_steps}, samples={samples}: both must be >= 1 with sampling")
        self.diffusion_sizes = {**BOLTZ2_SIZES, **dict(diffusion or {})}
        if kernels not in ops_kernels.KERNELS:
            raise ValueError(f"kernels={kernels!r}: allowed {', '.join(ops_kernels.KERNELS)}")
        self.kernels, self.compile_training = kernels, bool(compile_training)
        if passes not in ops_kernels.PASSES:
            raise ValueError(f"passes={passes!r}: allowed {', '.join(ops_kernels.PASSES)}")
        self.passes = passes
        if attention not in ops_kernels.ATTENTION:
            raise ValueError(f"attention={attention!r}: allowed {', '.join(ops_kernels.ATTENTION)}")
        self.attention = attention
        self.cuda_graphs = bool(cuda_graphs)  # inference at cp=1: the blocks as a replayed CUDA graph
        self._stats: dict[str, Any] = {}

    def build_model(self, mesh: Any, device: torch.device) -> nn.Module:
        """The trunk with the same global weights at any cp, in the compute dtype on ``device``;
        selects this process's kernel backend (``ops/kernels.py``)."""
        ops_kernels.select(self.kernels, torch.device(device))
        ops_kernels.compile_training(self.compile_training)
        ops_kernels.select_passes(self.passes)
        ops_kernels.select_attention(self.attention)
        self.dtype = TORCH_DTYPES[dtypes.resolve(self.dtype_name, torch.device(device).type)[0]]
        model = PairformerTrunk(**self.sizes).to(device=device, dtype=self.dtype)
        model.layout = layout_from_mesh(mesh)
        model.graphs = GraphedBlocks() if self.cuda_graphs else None
        model.denoiser_graphs = GraphedDenoiser() if self.cuda_graphs and self.sampling else None
        model.optimizer = None  # created at the first training step (AdamW states count in its peak)
        model.diffusion = None
        if self.sampling:  # built after the trunk, so the trunk's weights do not depend on sampling
            model.diffusion = DiffusionModule(self.sizes["c_s"], self.sizes["c_z"], **self.diffusion_sizes).to(
                device=device, dtype=self.dtype)
            model.sampling_seed = int(torch.randint(0, 2**62, (1,)))  # same on every rank (harness seed)
        return model

    def build_batch(self, N: int, n_atoms: int, S: int, mesh: Any, device: torch.device) -> dict[str, torch.Tensor]:
        """Global synthetic features, padded to a multiple of the CP size and of 16 on CUDA, 8 on a CPU
        (``padding.token_multiple``);
        of the O(S·N) MSA features (``msa``, ``has_deletion``, ``deletion_value``, ``msa_mask``)
        each rank keeps only its own token columns, ``[S, N/P]``."""
        layout = layout_from_mesh(mesh)
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,))))
        feats = make_synthetic_features(N, n_atoms, S, generator)
        padded, _ = pad_features(feats, units=layout.units, token_multiple=token_multiple(layout.units, torch.device(device)))
        cols = layout.rows(padded["token_mask"].shape[0])
        for key in MSA_KEYS:
            padded[key] = padded[key][:, cols].contiguous()
        return {k: v.to(device) for k, v in padded.items()}

    def run_step(self, model: nn.Module, batch: dict[str, torch.Tensor], train: bool,
                 run_blocks: int | None = None, lean: bool = False) -> torch.Tensor | None:
        """Inference: recycles + 1 trunk passes without autograd, then with ``sampling`` the
        diffusion sampler (``sampling_steps`` steps x ``samples`` samples, ``sampler.sample``).
        Training: forward, backward, gradient all-reduce and an AdamW step; returns the global
        loss (same on every rank); the diffusion module is not trained.

        ``run_blocks=k`` (probe depth) runs k trunk blocks in one pass (``PROBE_RECYCLES``) and,
        when sampling, ``min(k, sampling_steps)`` sampler steps of k token blocks each: a step's
        peak does not depend on how many blocks, passes or steps ran before it (recycling updates
        z in place, so every pass repeats the first's allocations; the probe checks that the peak
        matches the full step's).

        ``lean=True`` (the probe's fitting points) runs every op with the lean chunk budget
        (``chunking.lean_budgets``): the step's peak is the trunk's irreducible memory.
        """
        with chunking.lean_budgets(lean):
            return self._step(model, batch, train, run_blocks)

    def _step(self, model: nn.Module, batch: dict[str, torch.Tensor], train: bool,
              run_blocks: int | None) -> torch.Tensor | None:
        layout: Layout = model.layout
        recycles = self.recycles if run_blocks is None else min(self.recycles, PROBE_RECYCLES)
        comm.BYTES.reset()
        timer = StageTimer(batch["token_mask"].device)
        start_s = now_s(batch["token_mask"])
        if not train:
            with torch.no_grad():
                with timer.stage("trunk"):
                    s, z = model(batch, layout, recycles=recycles, run_blocks=run_blocks, timer=timer)
                finite = _outputs_finite(s, z)
                if model.diffusion is not None:
                    with timer.stage("sampling"):
                        ctx = model.diffusion.prepare(s, z, model.s_inputs, batch, layout)
                        del s, z  # z now holds the normalised pair conditioning (ctx.z_hat)
                        coords = sample(model.diffusion, ctx, self.sampling_steps, self.samples, model.sampling_seed,
                                        run_steps=run_blocks, run_blocks=run_blocks, graphs=model.denoiser_graphs)
                        del ctx
                        if isinstance(coords, torch.Tensor):
                            finite = finite and bool(torch.isfinite(coords.sum(dtype=torch.float32)))
            self._record(model, start_s, now_s(batch["token_mask"]), None, timer)
            self._stats["outputs_finite"] = finite
            return None
        if model.optimizer is None:
            model.optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr)
        model.optimizer.zero_grad(set_to_none=True)
        with timer.stage("forward"):  # stage peaks only: training stage times come from now_s
            s, z = model(batch, layout, recycles=recycles, run_blocks=run_blocks, checkpointing=self.checkpointing,
                         checkpoint_ops=self.checkpoint_ops)
            local_loss = trunk_loss(s, z, batch["token_mask"], layout)
        forward_end_s = now_s(z)
        del s, z
        with timer.stage("backward"):  # stage peaks only, as above
            local_loss.backward()
            all_reduce_grads(model, layout)
        with timer.stage("optimizer"):
            model.optimizer.step()
        loss = comm.all_reduce_(local_loss.detach().clone(), layout)
        self._record(model, start_s, forward_end_s, now_s(loss), peaks=timer.peaks_gib())
        return loss

    def _record(self, model: PairformerTrunk, start_s: float, forward_end_s: float, end_s: float | None,
                timer: StageTimer | None = None, peaks: dict[str, float] | None = None) -> None:
        if timer is not None:  # inference: embedding, msa, trunk (blocks + recycling), sampling
            stage_ms = timer.ms()
            stage_ms["trunk"] = stage_ms["trunk"] - stage_ms.setdefault("embedding", 0.0) - stage_ms.get("msa", 0.0)
        else:
            stage_ms = {"forward": (forward_end_s - start_s) * 1e3}
        if end_s is not None:
            stage_ms["backward_optimizer"] = (end_s - forward_end_s) * 1e3
        block_ms = model.block_ms
        if block_ms:
            stage_ms["block_mean"] = sum(block_ms) / len(block_ms)
        device = next(model.parameters()).device
        self._stats = {
            "stage_ms": stage_ms,
            "comm_bytes_per_block": max(model.block_comm_bytes, default=0),
            "comm_bytes_step": comm.BYTES.sent_b,
            "comm_per_block": _heaviest(model.block_comm),
            "comm_step": comm.BYTES.snapshot(),
            "kernels": ops_kernels.ran(training=end_s is not None, device=device),
            "compile_s": round(ops_kernels.compile_seconds(), 3),
        }
        triton_ran = {"passes": ops_kernels.passes_ran(training=end_s is not None, device=device),
                      "attention": ops_kernels.attention_ran(training=end_s is not None, device=device)}
        self._stats.update({key: ran for key, ran in triton_ran.items() if ran})
        if model.graphs is not None:  # model.cuda_graphs: how the last pass's blocks ran
            self._stats["cuda_graphs"] = model.graphs.state
            capture_s = model.graphs.capture_s
            if model.denoiser_graphs is not None:  # and the last sampling run's denoiser calls
                self._stats["cuda_graphs_denoiser"] = model.denoiser_graphs.state
                capture_s += model.denoiser_graphs.capture_s
            self._stats["graph_capture_s"] = round(capture_s, 3)
        peaks = timer.peaks_gib() if timer is not None else (peaks or {})
        if peaks:  # CUDA only: per-stage peak allocated (StageTimer)
            self._stats["stage_peak_gib"] = peaks
        if sdpa_lse.kernel_in_use() is not None:  # CUDA, ops that merge attention pieces (2d)
            self._stats["attention_lse_kernel"] = sdpa_lse.kernel_in_use()

    def stats(self) -> dict[str, Any]:
        """Measurements of the last step: ``stage_ms`` (inference: embedding, msa with an MSA
        module, trunk -- the blocks and recycling alone --, sampling with ``workflow.sampling``;
        training: forward, backward_optimizer; both: block_mean),
        ``comm_bytes_per_block`` (bytes this rank sent in one block's forward) and
        ``comm_bytes_step`` (the whole step, backward and gradient all-reduce included),
        ``comm_per_block`` and ``comm_step`` (the same per collective kind: ``{kind: {"calls",
        "bytes"}}``, kinds ``comm.KINDS``; the block is the one that sent most); on CUDA,
        where attention pieces were merged (2d), ``attention_lse_kernel`` (``cudnn`` or
        ``efficient``, see ``sdpa_lse``); ``kernels`` (the backend whose ops ran: ``torch``, ``flex`` or
        ``cueq``; ``torch`` for training under ``flex`` without compiled training, ``kernels.ran``),
        ``passes`` (``triton`` where the passes over z ran as ``ops/triton_passes.py``'s kernels:
        ``model.passes=triton`` under ``flex`` on CUDA, inference or compiled training; absent otherwise), ``attention``
        (``triton`` where triangle attention ran ``ops/triton_attention.py``'s kernel:
        ``model.attention=triton``, inference under ``flex`` on CUDA)
        and ``compile_s`` (wall seconds of ``torch.compile`` in this process so far: the first
        calls, which the timing's warmup absorbs); with ``cuda_graphs``, ``cuda_graphs`` (how the
        last pass's blocks ran: ``replay``, ``eager`` or ``capture failed: ...``,
        ``modules/cuda_graphs.py``), with sampling ``cuda_graphs_denoiser`` (how the last sampling
        run's denoiser calls ran: ``replay`` from the second call on, or as above) and
        ``graph_capture_s`` (wall seconds capturing, in this process: the blocks once per shape,
        in the warmup; the denoiser once per sampling run, inside each step's time); on CUDA ``stage_peak_gib`` (peak
        allocated GiB per stage: embedding, msa, trunk -- which includes its nested embedding
        and msa --, sampling; training: forward, backward (with the gradient all-reduce),
        optimizer; ``StageTimer.peaks_gib``)."""
        return dict(self._stats)

