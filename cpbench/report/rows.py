"""Result records -> pandas frames: one row per result, and one row per probe point.

A timing result gives one row at its N; a probe result gives one ``max-fit`` row at its max N
(peak memory there, the first failing N with its cause, and ``lower_bound``: why that max N only
bounds the max N from below, or None when an out-of-memory bounds it from above). A failed job (oom, timeout, error,
insufficient_gpus) still gives its row, with the status and message, so the table always has a
row for every point of the sweep. Column names of the first six match the report's table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from cpbench.models.foldcp import package as foldcp_package
from cpbench.models.pairformer import flops
from cpbench.models.stock import stock_model_of
from cpbench.report.mfu import achieved_tflops_per_gpu, peak_tflops
from cpbench.results import INCOMPLETE, max_over_ranks
from cpbench.results.memory_fit import fit_peak_memory, fitting_points

TABLE_COLUMNS = ("N_tokens", "N_atoms", "MSA_seq", "CP config", "peak_mem (GiB)", "walltime (ms)")
STAGE_PREFIX = "stage_ms."
STAGE_PEAK_PREFIX = "stage_peak_gib."  # per-stage peak allocated (stats.stage_peak_gib), where measured
ENERGY_COLUMN = "energy (J/step)"  # summed over ranks (energy_j_per_step_per_rank), where NVML had the counter
# Overrides that change what a model preset computes (its depth and module sizes).
SIZE_KEYS = frozenset({"model.blocks", "model.msa_blocks", "model.atom_blocks", "model.c_s", "model.c_z",
                       "model.diffusion.blocks"})
BLOCKS_ONLY_CHECKPOINTS = "model.checkpoint_ops=false"  # a training point that checkpoints the blocks only
COMPILED_TRAINING = "model.compile_training=true"  # the label of a training point on the compiled flex path
PAIRFORMER_PRESET = "pairformer"  # model=pairformer: the sizes of model=boltz2 under the preset's own name
HARDWARE = "hardware"  # the GPU model a row ran on ("NVIDIA H200"), "CPU": part of every configuration's identity


def hardware_of(rec: dict) -> str:
    """What a result ran on: its GPU model (``env.gpu_model``) on CUDA, ``CPU`` on a CPU, else the
    device name (``""`` where the record says nothing). Figures of two GPU models are never one
    configuration: every grouping of the report keys on it."""
    env, point = rec.get("env") or {}, rec.get("point") or {}
    device = point.get("device") or env.get("device") or ""
    if device == "cuda" and env.get("gpu_model"):
        return str(env["gpu_model"])
    return "CPU" if device == "cpu" else str(device)


def short_gpu(hardware: object) -> str:
    """A GPU model as tables name it: ``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``."""
    return str(hardware).removeprefix("NVIDIA ")


def with_hardware(label: str, hardware: object, several: bool) -> str:
    """``label`` followed by ``on H100 80GB HBM3`` where a table holds ``several`` GPU models."""
    if not several or not isinstance(hardware, str) or not hardware:
        return label
    return f"{label} on {short_gpu(hardware)}"


def ensure_hardware(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``hardware`` column ("" where a frame made by hand has none)."""
    return frame if HARDWARE in frame else frame.assign(**{HARDWARE: ""})


def several_hardware(frame: pd.DataFrame) -> bool:
    """Whether ``frame``'s rows ran on more than one kind of hardware."""
    return HARDWARE in frame and frame[HARDWARE].nunique() > 1


def hardware_in_model(frame: pd.DataFrame, several: bool) -> pd.DataFrame:
    """``frame`` with its hardware folded into the model label where ``several`` ran (the plots,
    whose series and legends key on the model), so that one key still tells them apart."""
    if not several or frame.empty or HARDWARE not in frame:
        return frame
    labels = [with_hardware(m, h, True) if isinstance(m, str) else m for m, h in zip(frame["model"], frame[HARDWARE])]
    return frame.assign(model=labels, **{HARDWARE: ""})


def model_label(rec: dict) -> str | None:
    """The model's name, plus the ``model.*`` overrides of its size when the run changed them
    (``boltz2 [model.blocks=1 model.msa_blocks=0]``): a sliced trunk is not the preset; and
    ``model.compile_training=true`` for a training point on the compiled flex path (CUDA; on a
    CPU the ``torch`` ops train whatever it says), and ``model.checkpoint_ops=false`` for one that
    checkpoints the blocks only."""
    point = rec.get("point") or {}
    name = (point.get("model") or (rec.get("config") or {}).get("model") or {}).get("name")
    if name == PAIRFORMER_PRESET:  # the default preset is the reference trunk at Boltz-2's sizes: one name
        name = "boltz2"
    changed = [o.lstrip("+") for o in rec.get("overrides") or []
               if o.lstrip("+").split("=")[0] in SIZE_KEYS]
    model = point.get("model") or {}
    if (point.get("workflow") == "training" and model.get("compile_training") and model.get("kernels") in ("auto", "flex")
            and point.get("device") == "cuda"):  # a different training path (kernels.ran), whatever the default was
        changed.append(COMPILED_TRAINING)
    if point.get("workflow") == "training" and model.get("checkpoint_ops") is False:
        changed.append(BLOCKS_ONLY_CHECKPOINTS)  # another memory and recompute: not the default's series
    return f"{name} [{' '.join(changed)}]" if name and changed else name


# Overrides that say where a job wrote, or how far a probe may go, not what it measured.
_NOT_THE_POINT = ("hydra.", "resume=", "report.", "probe.budget_s=", "probe.max_points=", "probe.timeout_s=", "timing.timeout_s=")


def command_of(rec: dict) -> str | None:
    """``python -m cpbench OVERRIDES``: the command that measured a record (its ``overrides``
    less where it wrote and its time limits; ``emulate.enabled=V`` as typed, ``emulate=V``)."""
    overrides = rec.get("overrides")
    if overrides is None:
        return None
    kept = [o.replace("emulate.enabled=", "emulate=", 1) for o in map(str, overrides)
            if not o.lstrip("+~").startswith(_NOT_THE_POINT)]
    return " ".join(["python -m cpbench", *kept])


def day_of(date: object) -> str:
    """``2026-12-02`` of a result's ``env.date`` (ISO 8601), "" where it has none."""
    return str(date or "")[:10]


def without_training_path(label: str) -> str:
    """``label`` without the compiled-training mark (``boltz2 [model.compile_training=true]`` ->
    ``boltz2``): where the kernel backend is a column of its own, the mark only repeats it (a
    training point that ran ``flex`` ran the compiled path, ``kernels_of``)."""
    name, _, rest = label.partition(" [")
    kept = [o for o in rest.rstrip("]").split() if o != COMPILED_TRAINING]
    return f"{name} [{' '.join(kept)}]" if kept else name


def stock_title(model: dict | None) -> str | None:
    """``Boltz-2`` for a stock single-GPU model (``model=stock/boltz2``), None for any other: the
    report compares the other models' max N with the stock ones' (``analysis.stock_baselines``)."""
    package = stock_model_of(model)
    return package.title if package else None


def workflow_label(point: dict[str, Any]) -> str | None:
    """``inference+sampling`` when the inference step ran the diffusion sampler, else the
    workflow's name: trunk-only and sampled inference are different measurements."""
    workflow = point.get("workflow")
    sampling = (point.get("model") or {}).get("sampling")
    return f"{workflow}+sampling" if workflow == "inference" and sampling is True else workflow


EMULATED = "emulated"  # the CP config label's mark of an emulated point: never mixed with measured ones


def cp_config_label(point: dict[str, Any]) -> str:
    """``1d cp=2`` or ``2d 2x2 cp=4`` from a result's ``point``; ``1d cp=2 emulated`` for rank 0
    of cp=2 alone over the fake process group (``emulate=true``), so that every table, plot and
    headline line keeps emulated figures apart from measured ones and says which they are."""
    topology, cp = point.get("topology", "1d"), point.get("cp")
    if cp is None:  # a job that failed before its point resolved
        return "unresolved"
    mesh = point.get("mesh_shape") or []
    label = f"2d {mesh[0]}x{mesh[1]} cp={cp}" if topology == "2d" and len(mesh) == 2 else f"{topology} cp={cp}"
    return f"{label} {EMULATED}" if point.get("emulated") else label


def result_rows(records: Iterable[tuple[Path, dict]], root: Path, peak_tflops: float | None = None) -> pd.DataFrame:
    """One row per result record (see the module docstring), in a stable order.

    Args:
        records: ``(path of result.json, record)`` pairs.
        root: the directory the report aggregates; ``result`` paths are relative to it.
        peak_tflops: the configured per-GPU peak (``report.peak_tflops``) for MFU; None -> the
            measured table in ``cpbench.report.mfu``.
    """
    rows = [_row(path, rec, root, peak_tflops) for path, rec in records]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=list(TABLE_COLUMNS) + ["workflow", "status", "row"])
    frame["_kind"] = (frame["row"] == "max-fit").astype(int)
    frame = frame.sort_values([HARDWARE, "model", "workflow", "topology", "cp", "CP config", "_kind", "N_tokens"],
                              na_position="last", kind="stable").drop(columns="_kind")
    for col in ("N_tokens", "N_atoms", "MSA_seq", "cp", "first_fail_n", "depth"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame.reset_index(drop=True)


def probe_point_rows(records: Iterable[tuple[Path, dict]]) -> pd.DataFrame:
    """One row per point every probe tried: N, fits, status, per-rank peak (max over ranks), and
    whether it ran lean (``points[].lean``)."""
    rows = []
    for _, rec in records:
        if rec.get("routine") != "probe":
            continue
        point = rec.get("point", {})
        for p in rec.get("points") or []:
            rows.append({
                "model": model_label(rec), "workflow": workflow_label(point), HARDWARE: hardware_of(rec),
                "topology": point.get("topology"), "cp": point.get("cp"), "CP config": cp_config_label(point),
                "emulated": bool(point.get("emulated")),
                "kernels": kernels_of(rec, point.get("model") or (rec.get("config") or {}).get("model") or {}),
                "dtype": point.get("dtype"), "N": p.get("N"), "fits": bool(p.get("fits")), "status": p.get("status"),
                "peak_alloc_gib": max_over_ranks(p.get("peak_alloc_gib")),
                "peak_reserved_gib": max_over_ranks(p.get("peak_reserved_gib")), "seconds": p.get("seconds"),
                "lean": bool(p.get("lean")),
            })
    return pd.DataFrame(rows, columns=["model", "workflow", HARDWARE, "topology", "cp", "CP config", "emulated", "kernels",
                                       "dtype",
                                       "N", "fits",
                                       "status", "peak_alloc_gib", "peak_reserved_gib", "seconds", "lean"])


def _row(path: Path, rec: dict, root: Path, peak_tflops_cfg: float | None) -> dict[str, Any]:
    point = rec.get("point") or {}
    config = rec.get("config") or {}
    env = rec.get("env") or {}
    stats = rec.get("stats") or {}
    model = point.get("model") or config.get("model") or {}
    row: dict[str, Any] = {
        "workflow": workflow_label(point), "status": rec.get("status"), "routine": rec.get("routine"),
        "topology": point.get("topology"), "cp": point.get("cp"),
        "mesh": "x".join(map(str, point.get("mesh_shape") or [])) or None,
        "model": model_label(rec), "stock": stock_title(model), "dtype": point.get("dtype"), "device": point.get("device"),
        HARDWARE: hardware_of(rec),
        "MSA_seq": point.get("S"), "CP config": cp_config_label(point), "emulated": bool(point.get("emulated")),
        "message": _first_line(rec.get("message")), "date": env.get("date"), "command": command_of(rec),
        "version": version_of(rec),
        "result": str(path.relative_to(root)) if path.is_relative_to(root) else str(path),
    }
    if rec.get("routine") == "probe":
        row.update(_probe_fields(rec, point, config))
    else:
        row.update(_timing_fields(rec, point))
    row["kernels"] = kernels_of(rec, model)
    row["comm bytes/block"] = stats.get("comm_bytes_per_block")
    row.update(comm_model_fields(rec.get("comm_model")))
    row["comm share"] = comm_share(stats)
    for stage, ms in stage_ms_without_fill(rec).items():
        row[STAGE_PREFIX + str(stage)] = ms
    for stage, gib in (stats.get("stage_peak_gib") or {}).items():
        row[STAGE_PEAK_PREFIX + str(stage)] = gib
    row.update(_flops_fields(row, model, config, env, peak_tflops_cfg))
    return row


def stage_ms_without_fill(rec: dict) -> dict[str, float]:
    """``stats["stage_ms"]`` of a record, the last timed step's stages. Under emulation that step's
    fill (``emulation_fill_ms[-1]``: the writes standing in for the collectives that the fake
    group leaves undone, which the worker takes out of every timed step) is taken out of the
    inference ``trunk`` stage too, where the per-block collectives run, so that the trunk's time is
    compute as the step's median is. Training stages (forward, backward) are left as measured."""
    stages = dict((rec.get("stats") or {}).get("stage_ms") or {})
    fills = rec.get("emulation_fill_ms") or []
    if fills and stages.get("trunk") is not None:
        stages["trunk"] = max(float(stages["trunk"]) - float(fills[-1]), 0.0)
    return stages


def kernels_of(rec: dict, model: dict) -> str | None:
    """The kernel backend a record ran: ``stats.kernels``, else its ``model.kernels`` choice, else
    ``torch`` for the reference trunk measured before the switch existed (None for other models).
    A training step under ``flex`` ran the ``torch`` ops unless compiled training ran on CUDA,
    which records before ``kernels.ran`` (the same rule, on the worker) named ``flex``. Where the
    trunk's blocks or the sampler's denoiser replayed a CUDA graph (``stats.cuda_graphs``,
    ``stats.cuda_graphs_denoiser``; ``model.cuda_graphs=true``), the
    backend gains ``+graphs`` (``flex+graphs``): another way to run the same point, compared
    beside the others. Where the passes over z ran as Triton kernels (``stats.passes``,
    ``model.passes=triton``) it gains ``+triton`` (``flex+triton``); where triangle attention ran
    the Triton kernel (``stats.attention``, ``model.attention=triton``), ``+tattn``."""
    stats = rec.get("stats") or {}
    ran = stats.get("kernels")
    point = rec.get("point") or {}
    if (ran == "flex" and point.get("workflow") == "training"
            and not (model.get("compile_training") and point.get("device") == "cuda")):
        return "torch"
    if ran:
        replayed = "replay" in (stats.get("cuda_graphs"), stats.get("cuda_graphs_denoiser"))
        ran += "+triton" if stats.get("passes") == "triton" else ""
        ran += "+tattn" if stats.get("attention") == "triton" else ""
        return f"{ran}+graphs" if replayed else ran
    if flops.is_reference_trunk(model):
        return model.get("kernels") or "torch"
    return foldcp_package.chosen_kernels_label(model)  # a peer's point that failed before recording them


def version_of(rec: dict) -> str | None:
    """What ran: the model's own package where its adapter names it (``stats.package``: ``boltz
    2.2.1 (Fold-CP 15f9775)``), else cpbench's commit (``cpbench 480eb0b``); None where neither is known."""
    package = (rec.get("stats") or {}).get("package")
    if package:
        return str(package)
    commit = (rec.get("env") or {}).get("git_commit")
    return f"cpbench {commit}" if commit else None


def _first_line(message: str | None) -> str:
    lines = (message or "").strip().splitlines()
    return lines[0] if lines else ""


def _probe_fields(rec: dict, point: dict, config: dict) -> dict[str, Any]:
    max_n = rec.get("max_n")
    at_max = [p for p in rec.get("points") or [] if p.get("fits") and p.get("N") == max_n]
    return {
        "row": "max-fit", "N_tokens": max_n, "N_atoms": _atoms_at(max_n, point, config),
        "peak_mem (GiB)": max_over_ranks(at_max[-1].get("peak_alloc_gib")) if at_max else None,
        "peak_reserved (GiB)": max_over_ranks(at_max[-1].get("peak_reserved_gib")) if at_max else None,
        "walltime (ms)": None, "first_fail_n": rec.get("first_fail_n"),
        "first_fail_status": rec.get("first_fail_status"), "depth": rec.get("depth"),
        "points_tried": len(rec.get("points") or []),
        "lower_bound": lower_bound_reason(rec), "timeout_n": timed_out_at(rec), "not_rerun": not_rerun(rec),
        "strategy": rec.get("strategy"), "predicted_max_n": rec.get("predicted_max_n"),
        PAIR_TERM: pair_term_gib(rec, point),
        # which stage set the max N: the stage peaks of the point at max N, where recorded
        **{STAGE_PEAK_PREFIX + str(stage): gib for stage, gib in
           ((at_max[-1].get("stage_peak_gib") or {}) if at_max else {}).items()},
    }


PAIR_TERM = "N² term (GiB/N²)"  # a probe's fitted per-rank peak a·N² + b·N + c: its a


def pair_term_gib(rec: dict, point: dict) -> float | None:
    """The N² coefficient of the per-rank peak fitted over a probe's fitting points
    (``results.memory_fit``): what a rank keeps per token pair at large N; None without one."""
    ns, peaks = fitting_points(rec.get("points") or [])
    if not ns:
        return None
    a = fit_peak_memory(ns, peaks, cp=int(point.get("cp") or 1)).a
    return a if a > 0 else None


def not_rerun(rec: dict) -> str | None:
    """The ends of a probe's bracket that ``probe.verify`` did not re-run (its time budget or the
    job ran out first), as ``"3,584 and 3,840"``; None when both were re-run, or verification was
    off or had nothing to re-run."""
    verify, max_n, fail_n = rec.get("verify"), rec.get("max_n"), rec.get("first_fail_n")
    if not isinstance(verify, dict) or not verify.get("skipped") or not (max_n and fail_n):
        return None
    missing = [f"{n:,}" for key, n in (("max_n", max_n), ("above", fail_n)) if not verify.get(key)]
    return " and ".join(missing) or None


def timed_out_at(rec: dict) -> int | None:
    """The smallest N a probe saw time out (``timed_out_n``), None when none did."""
    timed_out = rec.get("timed_out_n") or []
    return min(int(n) for n in timed_out) if timed_out else None


def lower_bound_reason(rec: dict) -> str | None:
    """Why a probe's max N is only a lower bound of the max N, None when an out-of-memory bounds
    it from above: ``stopped early`` (incomplete, or ``capped``: a probe cap before the bisection
    ended), ``timeout``, ``no failure``, ``unstable`` or ``first failure <status>``: the record's
    ``lower_bound``, which every probe record has (an incomplete one: from its status)."""
    status = rec.get("status")
    if status == INCOMPLETE:
        return "stopped early"
    if status == "unstable":
        return "unstable"
    return "stopped early" if rec.get("lower_bound") == "capped" else rec.get("lower_bound")


def _timing_fields(rec: dict, point: dict) -> dict[str, Any]:
    return {
        "row": "timing", "N_tokens": point.get("N"), "N_atoms": point.get("N_atoms"),
        "peak_mem (GiB)": max_over_ranks(rec.get("peak_alloc_gib")),
        "peak_reserved (GiB)": max_over_ranks(rec.get("peak_reserved_gib")),
        "walltime (ms)": rec.get("median_ms"), "IQR (ms)": rec.get("iqr_ms"),
        "min (ms)": rec.get("min_ms"), "max (ms)": rec.get("max_ms"), "tokens/s": rec.get("tokens_per_s"),
        ENERGY_COLUMN: energy_per_step(rec),
    }


def energy_per_step(rec: dict) -> float | None:
    """Joules per step summed over the ranks' GPUs (``energy_j_per_step_per_rank``, NVML's energy
    counter around the timed repeats); None (absent, not zero) unless every rank measured it."""
    per_rank = rec.get("energy_j_per_step_per_rank")
    if not per_rank or any(e is None for e in per_rank):
        return None
    return float(sum(per_rank))


def _atoms_at(n_tokens: int | None, point: dict, config: dict) -> int | None:
    """Atoms at the probe's max N: a fixed ``N_atoms`` if the config set one, else per token."""
    if n_tokens is None:
        return None
    if config.get("N_atoms") not in (None, "null"):
        return int(config["N_atoms"])
    per_token = config.get("atoms_per_token")
    if per_token is None and point.get("N") and point.get("N_atoms"):
        per_token = point["N_atoms"] / point["N"]
    return int(round(per_token * n_tokens)) if per_token else None


def comm_model_fields(block: dict | None) -> dict[str, Any]:
    """A timing's modelled communication (``comm_model``, ``cpbench.link``): its time on the
    link, the predicted step range (emulated: compute alone was measured) and the dominant cost."""
    if not block:
        return {}
    low_high = block.get("step_ms_range")
    return {"comm (ms, modelled)": block.get("comm_ms"), "link": (block.get("link") or {}).get("name"),
            "step range (ms, modelled)": f"{low_high[0]:,.0f}-{low_high[1]:,.0f}" if low_high else None,
            "dominant cost": block.get("dominant")}


def comm_share(stats: dict) -> float | None:
    """Fraction of the step spent in communication, where the adapter measured it.

    ``stats["comm_share"]`` if the adapter gives it; else the ``comm``-named stages of
    ``stats["stage_ms"]`` over the sum of all its stages (stages partition the measured time,
    so the ratio holds whether they were timed per block or per step).
    """
    if stats.get("comm_share") is not None:
        return float(stats["comm_share"])
    stages = {str(k): float(v) for k, v in (stats.get("stage_ms") or {}).items() if v is not None}
    comm = sum(v for k, v in stages.items() if "comm" in k.lower())
    total = sum(stages.values())
    if not stages or total <= 0 or not any("comm" in k.lower() for k in stages):
        return None
    return comm / total


def _flops_fields(row: dict, model: dict, config: dict, env: dict, peak_tflops_cfg: float | None) -> dict[str, Any]:
    """Step FLOPs, achieved TFLOP/s per GPU and MFU of a timing row of the reference trunk."""
    out: dict[str, Any] = {"step TFLOP": None, "TFLOP/s/GPU": None, "MFU": None, "flops time": None,
                           "peak source": None}
    if row["row"] != "timing" or row["status"] != "ok" or not flops.is_reference_trunk(model):
        return out
    if row["N_tokens"] is None or not row["walltime (ms)"]:
        return out
    workflow = config.get("workflow") or {}
    step = flops.step_flops(int(row["N_tokens"]), flops.PairformerSizes.from_config(model),
                            train=bool(workflow.get("train", row["workflow"] == "training")),
                            recycles=int(workflow.get("recycles", model.get("recycles") or 0) or 0),
                            checkpointing=bool(workflow.get("checkpointing", model.get("checkpointing"))),
                            checkpoint_ops=bool(model.get("checkpoint_ops", True)))
    out["step TFLOP"] = step["step"] / 1e12
    # Inference also embeds and samples, which the count leaves out: where the adapter timed the
    # trunk stage (all recycle passes), divide by that; else by the whole step's median.
    trunk_ms = row.get(STAGE_PREFIX + "trunk")
    time_ms, out["flops time"] = ((float(trunk_ms), "trunk stage") if row["workflow"] != "training" and trunk_ms
                                  else (float(row["walltime (ms)"]), "step median"))
    out["TFLOP/s/GPU"] = achieved_tflops_per_gpu(step["step"], time_ms, int(row["cp"] or 1))
    peak, source = peak_tflops(env.get("gpu_model"), row["dtype"], peak_tflops_cfg)
    if peak:
        out["MFU"] = out["TFLOP/s/GPU"] / peak
        out["peak source"] = source
    return out
