"""The project's text says what was measured and where, never when in the project's history.

No numbered working sessions ("the ninth device session", "this session"), no issue numbers
("#17", "issue 36"), no campaign call labels ("call g2", "calls e and t", "campaign8") in the
README, the top-level docs (``docs/*.md``, the generated ``docs/cp_benchmark.md`` included),
the package (``cpbench/``, its config tree wherever it lives), ``conf/`` or ``scripts/``. A
measurement is named by its date, machine and raw-file folder; a path into a raw-file folder
(``docs/benchmarks/2026-12-01-h200-e/call-g2``, ``2026-12-02-h200-h/call-y/h19``) may spell the
folder's name. The records under ``docs/benchmarks/`` are not checked: they are what was run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDINALS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
            "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth").split()
_ORDINAL = rf"(?:{'|'.join(ORDINALS)}|twenty-\w+|\d+(?:st|nd|rd|th))"
# a word break inside a comment ("Ninth device\n# session") is still a break between words
_GAP = r"[\s#*\"']+"

PATTERNS = {
    "numbered session": rf"\b{_ORDINAL}{_GAP}(?:device{_GAP})?sessions?\b",
    "session named relative to this one": rf"\b(?:this|that|next|previous|earlier|later|same){_GAP}(?:device{_GAP})?sessions?\b",
    "numbered campaign": rf"\b(?:{_ORDINAL}{_GAP}campaigns?\b|campaign[ _-]?\d+)",
    "issue number": r"\bissues?\s+#?\d+\b",
    "call label": r"\bcalls?[- ](?:[a-z]{1,2}\d?|\d+)\b(?:(?:,| and| or|/)\s*(?:[a-z]{1,2}\d?|\d+)\b)*|\bcall\d+\b",
}
# "call a" and friends in plain English: a label is one or two letters, and these are words
ENGLISH_AFTER_CALL = {"a", "an", "as", "at", "be", "by", "do", "go", "if", "in", "is", "it", "me", "my", "no",
                      "of", "on", "or", "so", "to", "up", "us", "we"}
# a raw-file folder's name inside a path: a date folder or docs/benchmarks/ in the same word
PATH_WORD = re.compile(r"benchmarks/|\d{4}-\d{2}-\d{2}-[\w.-]*/")
# another project's issue tracker, cited by name ("NVIDIA/nccl issue 1685", "nccl issues 1685, 864")
UPSTREAM = re.compile(r"(?:[\w.-]+/[\w.-]+|\b(?:nccl|pytorch|torch|hydra|submitit|triton|slurm|boltz|openfold3"
                      r"|protenix|cuequivariance))\s+$", re.IGNORECASE)
ISSUE_REF = re.compile(r"(?<![\w&#/])#\d+\b(?![\w-])")
CODE_SPAN = re.compile(r"``[^`\n]*``|`[^`\n]*`")


def _files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("cpbench", "conf", "scripts"):
        files += sorted(p for p in (ROOT / top).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".png"))
    return [p for p in files if p.exists()]


def _word_around(text: str, start: int, end: int) -> str:
    """The whitespace-delimited word (quotes and brackets stripped) holding ``text[start:end]``."""
    left = max(text.rfind(c, 0, start) for c in " \t\n(`'\"[") + 1
    rights = [i for i in (text.find(c, end) for c in " \t\n)`'\"],") if i != -1]
    return text[left:min(rights) if rights else len(text)]


def process_words(text: str) -> list[tuple[int, str, str]]:
    """``(line, kind, match)`` for every process word in ``text``."""
    hits = []
    for kind, pattern in PATTERNS.items():
        for m in re.finditer(pattern, text, re.IGNORECASE):
            if kind == "call label":
                # "calls a, b and c" lists labels; "call on, or ..." is English
                labels = set(re.findall(r"\b\w+\b", re.split(r"[- ]", m.group(0).lower(), maxsplit=1)[-1]))
                if labels <= ENGLISH_AFTER_CALL | {"and"} and not m.group(0).lower().startswith("call-"):
                    continue
                if PATH_WORD.search(_word_around(text, m.start(), m.end())):
                    continue
            if kind == "issue number" and UPSTREAM.search(text[max(0, m.start() - 60):m.start()]):
                continue
            hits.append((text.count("\n", 0, m.start()) + 1, kind, m.group(0)))
    # an issue number is "#17", not a job number in a code literal (``#3 (cp=4 N=2048)``),
    # a colour (#1f77b4), an anchor (page.md#17-x) or a comment's "# 17"
    prose = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    for m in ISSUE_REF.finditer(prose):
        hits.append((prose.count("\n", 0, m.start()) + 1, "issue number", m.group(0)))
    return sorted(hits)


@pytest.mark.parametrize("text", [
    "measured in the seventeenth session", "the 9th device session", "(docs/perf_notes.md, \"Ninth device\n# session\")",
    "not measured this session", "met in the second campaign", "as campaign8_h200 ran it",
    "the regression #17 names", "see issue 36", "call-g2 ran it", "call g2 of the run", "calls e and t agree",
    "in call fr", "calls 8 to 10", "call4 to call7", "Call e (commit f0a59b1)", "calls a, b and c",
])
def test_process_words_are_found(text):
    assert process_words(text), text


@pytest.mark.parametrize("text", [
    "a worker lives in its own session", "start_new_session=True", "# 17 tokens of padding",
    "colour #1f77b4", "[the launcher](docs/slurm.md#routineauto-one-probe-per-configuration)",
    "``#3 (cp=4 N=2048)``: the job number", "files in `docs/benchmarks/2026-12-01-h200-e/call-g2`",
    "(`2026-12-02-h200-h/call-y/h19/2/result.json`)", "submitit calls it on the time limit",
    "the three hooks cpbench calls to benchmark", "call a function", "a call to agree_min",
    "as Boltz2.forward calls it, with", "each call is one step", "the first call in a process",
    "whichever it has to call on, or none",
    "(NVIDIA/nccl issue 1685, excluding PyTorch's)", "NCCL's published footprint (nccl issues 1685, 864)",
])
def test_ordinary_words_are_not_flagged(text):
    assert not process_words(text), text


def test_no_process_words_in_docs_code_and_config():
    """Say what was measured and where (date, machine, raw-file folder), not when in the
    project's history; the records under docs/benchmarks/ are exempt, prose that cites them is not."""
    found = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {kind}: {match!r}" for line, kind, match in process_words(text)]
    assert not found, "process words (say what was measured and where instead):\n" + "\n".join(found)
