"""FASTA -> (tokens, atoms, MSA depth), with Boltz's header convention naming each A3M.

One record per chain (or ligand)::

    >A|protein|ubiquitin.a3m      ID|TYPE|MSA: the A3M path, relative to the FASTA file
    MQIFVKTLTG...
    >B|protein                    no MSA (or MSA 'empty'): the query row only
    >C|dna
    ACGT...
    >L|smiles                     a ligand: the record's sequence is its SMILES
    CC(=O)O
    >M|ccd                        a ligand by CCD code (needs dataset.ccd)
    SAH
    >my protein                   a header without '|' is a protein without MSA

TYPE is one of protein, dna, rna, smiles, ccd. A sequence may wrap over several lines.
"""

from __future__ import annotations

from pathlib import Path

from cpbench.data.chem import ComponentsDictionary, smiles_heavy_atoms
from cpbench.data.msa import a3m_depth
from cpbench.data.tokenize import InputError, Sizes, per_atom, polymer_residues, read_text, standard_residue

TYPES = ("protein", "dna", "rna", "smiles", "ccd")


def read_fasta(path: Path, ccd: ComponentsDictionary) -> tuple[Sizes, int]:
    """Sizes and MSA depth of a FASTA file (raises ``InputError`` naming ``file:line``)."""
    lines = read_text(path, "FASTA").splitlines()
    records: list[tuple[int, str, str]] = []  # (header line, header, sequence)
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith(">"):
            records.append((number, line[1:].strip(), ""))
        elif not records:
            raise InputError(f"{path}:{number}", "sequence before the first '>' header")
        else:
            records[-1] = (records[-1][0], records[-1][1], records[-1][2] + line)
    if not records:
        raise InputError(f"{path}", "no FASTA records ('>' headers)")
    total, depth = Sizes(), 1
    for number, header, sequence in records:
        where = f"{path}:{number}"
        fields = [f.strip() for f in header.split("|")] if "|" in header else [header, "protein"]
        kind = fields[1].lower() if len(fields) > 1 else ""
        if kind not in TYPES:
            raise InputError(where, f"header type {kind!r}: expected ID|TYPE[|MSA] with TYPE one of {', '.join(TYPES)}")
        if not sequence:
            raise InputError(where, f"record {header!r} has no sequence")
        if kind == "smiles":
            total += per_atom(smiles_heavy_atoms(sequence, where))
        elif kind == "ccd":
            total += per_atom(ccd.heavy_atoms(sequence, in_polymer=False, where=where))
        else:
            total += sum(map(standard_residue, polymer_residues(kind, sequence, where)), Sizes())
            msa = fields[2] if len(fields) > 2 else ""
            if msa and msa.lower() != "empty" and kind == "protein":
                msa_path = Path(msa).expanduser()
                msa_path = msa_path if msa_path.is_absolute() else path.parent / msa_path
                depth = max(depth, a3m_depth(msa_path, sequence, f"{where}: MSA"))
    return total, depth
