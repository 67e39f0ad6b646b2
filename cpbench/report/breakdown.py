"""``## Memory at the peak``: what one rank keeps at the peak of a timed configuration, by owner and
by the function that allocated it (timing records with ``memory.breakdown=true``,
``cpbench.harness.breakdown``).

One row per configuration and N (model, workflow, CP config, dtype, hardware; the latest record
where several ran), every figure in GiB and, beside the peak, over one rank's share of the pair
tensor z (``N²/K · c_z`` in the compute dtype): a peak of 15 shards keeps fifteen z-shard-sized
tensors' worth at once. Under each table, the functions that hold the most at the peak.
"""

from __future__ import annotations

from cpbench.report.peers import pair_shard_gib
from cpbench.report.rows import cp_config_label, day_of, hardware_of, model_label, short_gpu, workflow_label

SITES_LISTED = 5  # functions listed per row under the table
HELD = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
        ("inputs", "inputs"), ("other_held", "other held"))
DASH = "—"


def _gib(value) -> str:
    return DASH if value is None else f"{value:.3f}"


def latest_breakdowns(records: list[dict]) -> list[tuple[tuple, dict]]:
    """``(key, record)`` per configuration and N with a breakdown, the latest record each, sorted;
    key = (model, workflow, CP config, N, dtype, hardware)."""
    found: dict[tuple, dict] = {}
    for rec in records:
        breakdown = rec.get("memory_breakdown")
        point = rec.get("point") or {}
        if not isinstance(breakdown, dict) or point.get("N") is None:
            continue
        key = (model_label(rec) or DASH, workflow_label(point) or DASH, cp_config_label(point), int(point["N"]),
               point.get("dtype") or DASH, hardware_of(rec))
        if key not in found or day_of((rec.get("env") or {}).get("date")) >= day_of((found[key].get("env") or {}).get("date")):
            found[key] = rec
    return sorted(found.items(), key=lambda kv: tuple(str(k) for k in kv[0][:3]) + (kv[0][3],) + kv[0][4:])


def breakdown_section(records: list[dict]) -> str:
    """The section (empty string where no record has a breakdown)."""
    rows = latest_breakdowns(records)
    if not rows:
        return ""
    text = ["## Memory at the peak", "",
            "What one rank keeps at the peak of one more step, untimed, after the timed repeats "
            "(`memory.breakdown=true`; the rank with the highest peak), replayed from torch.profiler's memory "
            "events (`cpbench/harness/breakdown.py`). Held: live when the step began, by owner (`other held`: "
            "the CUDA allocator's count at the step's start less the owners', e.g. CUDA-graph pools and "
            "caches; unknown on a CPU). In the step: allocated during the step and live at its peak. "
            "`× z shard`: the peak over one rank's share of the pair tensor (`N²/K · c_z` elements in the "
            "compute dtype). Allocator peak: `torch.cuda.max_memory_allocated` over the same step, the check "
            "on the replay (CUDA only; a CPU's timing peak is its resident set, which this does not count). Blocks "
            "whose free the profiler did not see (a collective's buffers freed on gloo's or NCCL's own threads) "
            "are left out of the replay and named under the sites.", "",
            "| model | workflow | CP config | N | dtype | hardware | rank | peak (GiB) | × z shard | "
            + " | ".join(label for _, label in HELD) + " | in the step | allocator peak | date |",
            "|" + "---|" * (9 + len(HELD) + 3)]
    sites = []
    for (model, workflow, cp_config, n, dtype, hardware), rec in rows:
        b = rec["memory_breakdown"]
        where = short_gpu(hardware) if hardware else DASH
        date = day_of((rec.get("env") or {}).get("date"))
        label = f"{model}, {workflow}, {cp_config}, N={n:,}, {where}"
        if "error" in b:
            text.append(f"| {model} | {workflow} | {cp_config} | {n:,} | {dtype} | {where} | {b.get('rank', DASH)} | "
                        + " | ".join([DASH] * (len(HELD) + 2)) + f" | {DASH} | {DASH} | {date} |")
            sites.append(f"- {label}: no breakdown ({b['error']})")
            continue
        point = rec.get("point") or {}
        shard = pair_shard_gib(n, int(point.get("cp") or 1), str(dtype), int((point.get("model") or {}).get("c_z") or 128))
        held = b.get("held_gib") or {}
        text.append(f"| {model} | {workflow} | {cp_config} | {n:,} | {dtype} | {where} | {b.get('rank', 0)} | "
                    f"{_gib(b.get('peak_gib'))} | {b['peak_gib'] / shard:.2f} | "
                    + " | ".join(_gib(held.get(key)) for key, _ in HELD)
                    + f" | {_gib(b.get('step_gib'))} | {_gib(b.get('allocator_peak_gib'))} | {date} |")
        top = [f"`{s['site']}` {s['gib']:.3f} GiB ({s['gib'] / shard:.2f} × z shard, {s['blocks']} blocks)"
               for s in (b.get("sites") or [])[:SITES_LISTED]]
        unseen = b.get("unseen_frees_gib") or 0
        if unseen > 0:  # blocks a backend's thread freed: out of the replay, named so the reader knows
            top.append(f"left out, freed on a backend's own thread: {unseen:.3f} GiB")
        sites.append(f"- {label}: " + ("; ".join(top) if top else "nothing allocated in the step was live at its peak"))
    return "\n".join(text + ["", "Where the step's share was allocated (the functions holding the most at the peak):",
                             ""] + sites)
