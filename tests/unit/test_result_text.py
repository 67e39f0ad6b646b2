"""The probe's last line (``results.text.summary``): the first failing N with its cause, a long
cause cut with an ellipsis that marks the cut (without it "Error code 12" read "Error code 1")."""

from __future__ import annotations

from cpbench.results.text import summary


def probe_record(message: str) -> dict:
    return {"routine": "probe", "status": "ok", "max_n": 640, "peak_alloc_gib": 0.07, "first_fail_n": 768,
            "first_fail_status": "oom", "first_fail_message": message, "points": [{}] * 6, "depth": 2,
            "point": {"model": {"name": "tiny"}, "workflow": "inference", "topology": "1d", "cp": 2,
                      "device": "cpu", "dtype": "fp32", "memory_limit_gib": 0.0625}}


def test_a_short_cause_is_quoted_whole():
    line = summary(probe_record("rank 1: OutOfMemoryError"))
    assert "max N = 640 (peak 0.07 GiB per rank), first failing N = 768 (oom: rank 1: OutOfMemoryError);" in line


def test_a_long_cause_ends_with_an_ellipsis_that_marks_the_cut():
    cause = "rank 1: RuntimeError: DefaultCPUAllocator: can't allocate memory: " + "x" * 80 + " Error code 12 (Cannot)"
    line = summary(probe_record(cause))
    quoted = line.split("first failing N = 768 (oom: ", 1)[1].split(");", 1)[0]
    assert quoted.endswith("…") and len(quoted) == 160 and cause.startswith(quoted[:-1])
