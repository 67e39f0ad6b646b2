"""One-line and one-paragraph accounts of a result record, for people watching a sweep."""

from __future__ import annotations


def one_line(record: dict) -> str:
    """``cp=2 N=48 timing ok median 12.3 ms`` — what a person watching a sweep reads."""
    p = record.get("point") or {}
    head = f"{p.get('workflow', '?')} {p.get('topology', '?')} cp={p.get('cp', '?')}"
    status = record.get("status")
    if record.get("routine") == "probe":
        head += f" probe {status}"
        if record.get("max_n") is not None:
            head += f" max_n={'≥' if record.get('lower_bound') else ''}{record['max_n']}"
        if record.get("first_fail_n") is not None:
            head += f" first_fail_n={record['first_fail_n']} ({record.get('first_fail_status')})"
    else:
        head += f" N={p.get('N', '?')} timing {status}"
        if record.get("median_ms") is not None:
            head += f" median {record['median_ms']:.1f} ms"
    if status != "ok" and record.get("message"):
        head += f": {record['message'][:200]}"
    return head


def start_line(point: dict, routine: str, routine_asked: str | None = None) -> str:
    """The job's first line: what it runs, where, in which dtype and why (``dtype=auto``)."""
    what = {"probe": "max-N probe", "timing": f"timing at N={point.get('N')}"}.get(routine, routine)
    if routine_asked == "auto":
        what += " (routine=auto)"
    model = (point.get("model") or {}).get("name", "?")
    cap = point.get("memory_limit_gib")
    return (f"cpbench: {what} of model {model}, {point.get('workflow')} {point.get('topology')} cp={point.get('cp')} "
            f"on {point.get('device')}{f' with a {cap:g} GiB/rank memory cap' if cap else ''}, "
            f"dtype {point.get('dtype')} ({point.get('dtype_reason') or 'asked'})")


def summary(record: dict) -> str:
    """A one-paragraph account of what the job did (printed by ``python -m cpbench``)."""
    p = record.get("point") or {}
    model = (p.get("model") or {}).get("name", "?")
    cap = p.get("memory_limit_gib")
    where = (f"model {model}, {p.get('workflow')} {p.get('topology')} cp={p.get('cp')} on {p.get('device')}"
             f"{f' in {dt}' if (dt := p.get('dtype')) else ''}{f' with a {cap:g} GiB/rank memory cap' if cap else ''}")
    path = record.get("_path", "result.json")
    if record.get("routine") == "probe":
        pts = record.get("points") or []
        text = f"cpbench probed the largest N that fits for {where}: "
        if record.get("max_n") is not None:
            peak = record.get("peak_alloc_gib")
            text += f"max N = {record['max_n']}" + (f" (peak {peak:.2f} GiB per rank)" if peak is not None else "")
        else:
            text += "no N fit"
        if record.get("first_fail_n") is not None:
            why = record.get("first_fail_message") or ""
            why = why if len(why) <= 160 else why[:159].rstrip() + "…"  # a cut is marked, never silent
            text += f", first failing N = {record['first_fail_n']} ({record.get('first_fail_status')}: {why})"
        if record.get("timed_out_n"):
            text += f"; N={', '.join(map(str, record['timed_out_n']))} timed out, so max N is a lower bound"
        if record.get("predicted_max_n") is not None:
            text += f"; predicted max N {record['predicted_max_n']} from the peaks of the first points"
        if record.get("max_n") is None and record.get("advice"):
            text += f"; {record['advice']}"
        if record.get("status") == "unstable":
            text += f"; {record.get('message')}"
        text += f"; {len(pts)} points tried, depth {record.get('depth')}"
    else:
        text = f"cpbench timed one {'training step' if p.get('workflow') == 'training' else 'inference step'} " \
               f"at N={p.get('N')} for {where}: status {record.get('status')}"
        if record.get("median_ms") is not None:
            text += (f", median {record['median_ms']:.2f} ms (IQR {record['iqr_ms']:.2f} ms over "
                     f"{len(record.get('times_ms', []))} repeats), peak {record.get('peak_alloc_gib') or 0:.2f} GiB, "
                     f"{record.get('tokens_per_s') or 0:.0f} tokens/s")
        elif record.get("message"):
            text += f" ({record['message'][:200]})"
    for note in record.get("notes") or []:
        text += f". Note: {note}"
    return text + f". Result: {path}"
