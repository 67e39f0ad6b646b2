"""Peer CP implementations: the reference trunk beside another team's CP trunk measured through
the same hooks and routines (Fold-CP, ``model=foldcp/*``; ``docs/peers.md``).

Rows pair up by configuration: workflow, CP config (emulated or not), dtype, device, hardware (the
GPU model) and the trunk's sizes, and by kernel class: ``plain`` where both run PyTorch's own ops (the reference
under ``model.kernels=torch``, Fold-CP with ``reference`` triangle and pair-bias attention),
``fastest`` where each runs its fastest kernels available there. Only the reference's trunk
without an MSA module (``model.msa_blocks=0``, no sampling) compares: Fold-CP's trunk has none.
Per pair: max N (``≥`` where a lower bound) with the pair shards a rank keeps at large N (the N²
term of the probe's fitted peak, ``rows.pair_term_gib``, in units of one rank's share of z,
``[N²/K, c_z]`` in the compute dtype), the trunk's time and per-rank peak at each N timed, and
that peak in the same units: how much each keeps per rank beyond its share of z. Failed points keep their
status, so a peer that has not run yet says why. Beside a peer's 2d grid of K ranks the reference's 1d
layout of K ranks (``1d cp=K``, the rest of the configuration equal) has rows of its own (``reference, 1d``).
"""

from __future__ import annotations

import pandas as pd

from cpbench.report.analysis import best_fit, is_lower_bound
from cpbench.report.rows import HARDWARE, PAIR_TERM, STAGE_PREFIX, day_of, short_gpu

REFERENCE = "reference"
REFERENCE_1D = "reference, 1d"  # the reference's 1d rows beside a peer's 2d grid of the same CP size
OURS = (REFERENCE, REFERENCE_1D)  # the implementations that are cpbench's own, in the order they are listed
PEERS = {"foldcp-": "Fold-CP"}  # model name prefix -> implementation
REFERENCE_TRUNK_ONLY = "model.msa_blocks=0"
PLAIN_KERNELS = {"torch", "reference"}  # the reference's model.kernels=torch; Fold-CP's reference backends
CONFIG = ["workflow", "CP config", "dtype", "device", HARDWARE, "sizes", "kernel class"]
DASH = "—"


def implementation(model: str | None) -> tuple[str, str] | None:
    """``(implementation, sizes)`` of a model label, None where it is not compared: ``reference``
    for the reference trunk without an MSA module (``boltz2 [model.msa_blocks=0 ...]``), the
    peer's name for a peer; ``sizes`` the other size overrides (``model.blocks=2``), "" for none."""
    if not isinstance(model, str):
        return None
    name, _, rest = model.partition(" [")
    overrides = rest.rstrip("]").split()
    if name == "boltz2":
        if REFERENCE_TRUNK_ONLY not in overrides:
            return None
        overrides.remove(REFERENCE_TRUNK_ONLY)
        return REFERENCE, " ".join(overrides)
    peer = next((title for prefix, title in PEERS.items() if name.startswith(prefix)), None)
    return (peer, " ".join(overrides)) if peer else None


def peer_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the section compares, with ``implementation``, ``sizes`` and ``kernel class``;
    only configurations where a peer ran (ok or not)."""
    if rows.empty or "model" not in rows:
        return pd.DataFrame()
    impl = rows["model"].map(implementation)
    sel = rows[impl.notna() & (rows["workflow"].isin(["inference", "training"]))].copy()
    if sel.empty:
        return sel
    sel["implementation"] = impl[sel.index].map(lambda v: v[0])
    sel["sizes"] = impl[sel.index].map(lambda v: v[1])
    sel["kernel class"] = sel["kernels"].map(lambda k: "plain" if k in PLAIN_KERNELS else "fastest")
    sel = pd.concat([sel, _reference_1d_beside_grids(sel)], ignore_index=True)
    has_peer = sel.groupby(CONFIG, dropna=False)["implementation"].transform(lambda s: (~s.isin(OURS)).any())
    return sel[has_peer]


def _reference_1d_beside_grids(sel: pd.DataFrame) -> pd.DataFrame:
    """The reference's 1d rows (``1d cp=K[ emulated]``) copied into each 2d configuration of the same
    CP size (``2d AxB cp=K[ emulated]``, the rest of the configuration equal) as ``reference, 1d``:
    a peer's grid beside both of the reference's layouts of K ranks."""
    ref_1d = sel[(sel["implementation"] == REFERENCE) & (sel["topology"] == "1d")]
    grids = sel.loc[sel["topology"] == "2d", ["CP config", "cp", "emulated"]].drop_duplicates()
    copies = [ref_1d[(ref_1d["cp"] == cp) & (ref_1d["emulated"] == emulated)]
              .assign(**{"CP config": label, "implementation": REFERENCE_1D})
              for label, cp, emulated in grids.itertuples(index=False)]
    return pd.concat(copies, ignore_index=True) if copies else sel.iloc[:0]


def _listed_at(impl: str) -> int:
    """Where an implementation's rows sit in its table: cpbench's own first (``OURS``), then the peers."""
    return OURS.index(impl) if impl in OURS else len(OURS)


def _trunk_ms(row: pd.Series) -> float | None:
    """The trunk stage's time where the adapter timed it (both do for inference: the last timed step's,
    an emulated one's less its fill, ``rows.stage_ms_without_fill``), else the step's median."""
    trunk = row.get(STAGE_PREFIX + "trunk")
    return float(trunk) if row["workflow"] == "inference" and pd.notna(trunk) else row.get("walltime (ms)")


def pair_shard_gib(n_tokens: int, cp: int, dtype: str, c_z: int = 128) -> float:
    """GiB of one rank's share of z: ``N²/K · c_z`` elements in the compute dtype."""
    return n_tokens * n_tokens / cp * c_z * (2 if dtype == "bf16" else 4) / 2**30


def _version(group: pd.DataFrame, impl: str) -> str:
    """The latest version a group's rows record; a peer's point that failed before naming its
    package says only which cpbench ran it."""
    known = group["version"].dropna() if "version" in group else pd.Series(dtype=object)
    if known.empty:
        return DASH
    named = known[~known.str.startswith("cpbench ")] if impl not in OURS else known
    return named.iloc[-1] if not named.empty else f"{DASH} (run by {known.iloc[-1]})"


def _max_n_cells(group: pd.DataFrame, dtype: str) -> tuple[str, str]:
    """(max N, pair shards of the N² term) of a group's best probe."""
    fits = group[(group["row"] == "max-fit") & group["N_tokens"].notna()]
    if fits.empty:
        return DASH, DASH
    best = best_fit(fits)
    n = int(best["N_tokens"].iloc[0])
    a = best[PAIR_TERM].iloc[0] if PAIR_TERM in best else None
    shards = DASH if a is None or pd.isna(a) else f"{a * n * n / pair_shard_gib(n, int(best['cp'].iloc[0]), dtype):.2f}"
    return f"{'≥ ' if bool(is_lower_bound(best).iloc[0]) else ''}{n:,}", shards


def _latest_timings(group: pd.DataFrame) -> dict[int, pd.Series]:
    """N -> the latest timing row at that N (ok or not; an ok row wins over a later failure)."""
    timing = group[(group["row"] == "timing") & group["N_tokens"].notna()]
    out: dict[int, pd.Series] = {}
    for n, at_n in timing.groupby("N_tokens"):
        at_n = at_n.assign(_ok=at_n["status"] == "ok", _date=at_n["date"].fillna("")).sort_values(["_ok", "_date"])
        out[int(n)] = at_n.iloc[-1]
    return out


def peers_section(rows: pd.DataFrame) -> str:
    """``## Peer CP implementations`` (see the module docstring)."""
    table = peer_rows(rows)
    head = "## Peer CP implementations"
    if table.empty:
        return head + "\n\nNo peer implementation (`model=foldcp/*`) was run here."
    text = [head, "", "The reference trunk (`model=boltz2 model.msa_blocks=0`, trunk only) beside each peer, per "
            "configuration and kernel class (`plain`: both on PyTorch's own ops; `fastest`: each on its fastest "
            "kernels here). `z shards (N² term)`: the N² term of the probe's fitted per-rank peak over one rank's "
            "share of the pair tensor (`N²/K · 128` elements): the pair-sized tensors a rank keeps at large N. Time: "
            "the last timed step's trunk stage (inference; emulated, less that step's fill) or the step's median "
            "(training). Peak: per rank, allocated (on a CPU the resident set above the worker's baseline, which "
            "also counts the heap glibc keeps: compare peers there by *Memory at the peak*, torch's own "
            "allocations); `× z shard`: "
            "that peak over the same share. "
            "Ratios: peer over reference, at the same N. `reference, 1d`: beside a 2d grid, the reference's 1d "
            "layout of the same K ranks, its rows as measured. `≥`: a lower bound.", ""]
    for config, same in table.groupby(CONFIG, dropna=False, sort=True):
        workflow, cp_config, dtype, device, hardware, sizes, klass = config
        sizes_note = f", {sizes}" if sizes else ""
        where = short_gpu(hardware) if isinstance(hardware, str) and hardware else device
        peak_head = "peak, resident set (GiB)" if device == "cpu" else "peak (GiB)"
        text += [f"**{workflow}, {cp_config}, {dtype} on {where}{sizes_note}, {klass} kernels**", "",
                 f"| implementation | version | kernels | max N | z shards (N² term) | N | time (ms) | {peak_head} | "
                 "× z shard | status | date |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        timings = {}
        for impl, group in sorted(same.groupby("implementation", sort=False), key=lambda kv: _listed_at(kv[0])):
            timings[impl] = _latest_timings(group)
            version = _version(group, impl)
            kernels = ", ".join(sorted(group["kernels"].dropna().astype(str).unique())) or DASH
            max_n, shards_n2 = _max_n_cells(group, str(dtype))
            for n, r in sorted(timings[impl].items()) or [(None, None)]:
                if r is None or r["status"] != "ok":
                    status = DASH if r is None else f"{r['status']}: {r.get('message') or ''}".rstrip(": ")
                    text.append(f"| {impl} | {version} | {kernels} | {max_n} | {shards_n2} | {'' if n is None else f'{n:,}'} | "
                                f"{DASH} | {DASH} | {DASH} | {status} | {'' if r is None else day_of(r.get('date'))} |")
                    continue
                ms, peak = _trunk_ms(r), r.get("peak_mem (GiB)")
                shard = pair_shard_gib(n, int(r["cp"]), str(dtype))
                text.append(f"| {impl} | {version} | {kernels} | {max_n} | {shards_n2} | {n:,} | {ms:,.1f} | "
                            f"{'' if pd.isna(peak) else f'{peak:.2f}'} | "
                            f"{'' if pd.isna(peak) else f'{peak / shard:.2f}'} | ok | {day_of(r.get('date'))} |")
        text += [""] + _ratios(timings, "resident-set peak" if device == "cpu" else "peak") + [""]
    return "\n".join(text).rstrip() + "\n"


def _ratios(timings: dict[str, dict[int, pd.Series]], peak_name: str = "peak") -> list[str]:
    """One line per peer and N both ran ok: time and peak (named ``peak_name``), peer over reference."""
    ref = timings.get(REFERENCE) or {}
    lines = []
    for impl, by_n in timings.items():
        if impl in OURS:
            continue
        for n, r in sorted(by_n.items()):
            base = ref.get(n)
            if base is None or base["status"] != "ok" or r["status"] != "ok":
                continue
            parts = [f"time {_trunk_ms(r) / _trunk_ms(base):.2f}×"]
            if pd.notna(r.get("peak_mem (GiB)")) and pd.notna(base.get("peak_mem (GiB)")):
                parts.append(f"{peak_name} {r['peak_mem (GiB)'] / base['peak_mem (GiB)']:.2f}×")
            lines.append(f"{impl} / reference at N={n:,}: " + ", ".join(parts) + ".")
    return lines or ["No N where both ran ok: no ratio yet."]
