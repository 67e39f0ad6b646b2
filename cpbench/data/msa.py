"""MSA depth of an A3M file: the number of sequences, the query included.

A3M (HHblits / ColabFold): FASTA records; upper-case letters and ``-`` are match states
(one per query residue), lower-case letters are insertions relative to the query, ``#``
lines are comments. The first record is the query.
"""

from __future__ import annotations

from pathlib import Path

from cpbench.data.tokenize import InputError, read_text


def a3m_depth(path: Path, query: str, where: str) -> int:
    """Sequences in the A3M at ``path`` for a chain whose sequence is ``query``.

    Args:
        path: the A3M file.
        query: the chain's one-letter sequence (the A3M's first record must equal it).
        where: the field that named the file, for errors (``"x.yaml: sequences[0].protein.msa"``).

    Raises:
        InputError: a missing/unreadable file (naming ``where``), an empty MSA, or a record
            whose match states do not line up with the query (naming ``file:line``).
    """
    if not path.is_file():
        raise InputError(where, f"no such MSA file {str(path)!r}")
    lines = read_text(path, "A3M").splitlines()
    records: list[tuple[int, str]] = []  # (line of the header, sequence)
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(">"):
            records.append((number, ""))
        elif not records:
            raise InputError(f"{path}:{number}", "A3M sequence before the first '>' header")
        else:
            records[-1] = (records[-1][0], records[-1][1] + line)
    if not records:
        raise InputError(where, f"MSA {str(path)!r} has no sequences")
    query = query.upper()
    for number, sequence in records:
        matches = "".join(c for c in sequence if c.isupper() or c == "-")
        if len(matches) != len(query):
            raise InputError(f"{path}:{number}",
                             f"A3M record has {len(matches)} match states, the query has {len(query)} residues")
    if records[0][1].upper() != query:
        raise InputError(f"{path}:{records[0][0]}", "the first A3M record (the query) differs from the chain's sequence")
    return len(records)
