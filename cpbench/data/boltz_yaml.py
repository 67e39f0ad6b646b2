"""Boltz input YAML -> (tokens, atoms, MSA depth).

The Boltz schema (``boltz predict input.yaml``)::

    version: 1
    sequences:
      - protein: {id: [A, B], sequence: MVLS..., msa: ./a.a3m, modifications: [{position: 1, ccd: MSE}]}
      - dna: {id: C, sequence: ACGT}
      - rna: {id: D, sequence: ACGU}
      - ligand: {id: E, smiles: 'CCO'}     # or ccd: SAH (a code or a list of codes)

``id`` may list several chains (copies). ``msa`` is an A3M path, relative to the YAML file,
or ``empty``; a protein without one contributes only its query row. ``constraints``,
``templates`` and ``properties`` do not change the sizes and are ignored.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cpbench.data.chem import ComponentsDictionary, smiles_heavy_atoms
from cpbench.data.msa import a3m_depth
from cpbench.data.tokenize import InputError, Sizes, per_atom, polymer_residues, read_text, standard_residue
from cpbench.data.vocab import STANDARD_RESIDUES

POLYMERS = ("protein", "dna", "rna")
ENTITY_TYPES = (*POLYMERS, "ligand")


def read_boltz_yaml(path: Path, ccd: ComponentsDictionary) -> tuple[Sizes, int]:
    """Sizes and MSA depth of a Boltz input YAML (raises ``InputError`` naming file and field)."""
    try:
        doc = yaml.safe_load(read_text(path, "YAML"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else f"{path}"
        raise InputError(where, f"malformed YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sequences"), list) or not doc["sequences"]:
        raise InputError(f"{path}: sequences", "a Boltz input needs a non-empty 'sequences' list")
    total, depth = Sizes(), 1
    for i, item in enumerate(doc["sequences"]):
        field = f"{path}: sequences[{i}]"
        if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in ENTITY_TYPES:
            raise InputError(field, f"each entry is one of {', '.join(ENTITY_TYPES)} (a mapping with one key)")
        kind, entity = next(iter(item.items()))
        field = f"{field}.{kind}"
        if not isinstance(entity, dict):
            raise InputError(field, "expected a mapping with id and sequence/smiles/ccd")
        copies = _copies(entity.get("id"), f"{field}.id")
        if kind == "ligand":
            total += _ligand(entity, field, ccd) * copies
        else:
            sizes, chain_depth = _polymer(kind, entity, field, path.parent, ccd)
            total += sizes * copies
            depth = max(depth, chain_depth)
    return total, depth


def _copies(ids, field: str) -> int:
    if isinstance(ids, (str, int)) and str(ids):
        return 1
    if isinstance(ids, list) and ids and all(isinstance(x, (str, int)) for x in ids):
        return len(ids)
    raise InputError(field, "a chain id or a non-empty list of chain ids is required")


def _polymer(kind: str, entity: dict, field: str, base: Path, ccd: ComponentsDictionary) -> tuple[Sizes, int]:
    sequence = entity.get("sequence")
    if not isinstance(sequence, str):
        raise InputError(f"{field}.sequence", "a one-letter sequence (string) is required")
    residues = polymer_residues(kind, sequence, f"{field}.sequence")
    for j, mod in enumerate(entity.get("modifications") or []):
        where = f"{field}.modifications[{j}]"
        if not isinstance(mod, dict) or not isinstance(mod.get("position"), int) or not mod.get("ccd"):
            raise InputError(where, "needs position (1-based int) and ccd (a CCD code)")
        if not 1 <= mod["position"] <= len(residues):
            raise InputError(f"{where}.position", f"{mod['position']} is outside the sequence (1..{len(residues)})")
        residues[mod["position"] - 1] = str(mod["ccd"]).upper()
    sizes = Sizes()
    for name in residues:
        if name in STANDARD_RESIDUES:
            sizes += standard_residue(name)
        else:  # a modified residue: its heavy atoms, less the leaving atoms of the peptide bond
            sizes += per_atom(ccd.heavy_atoms(name, in_polymer=True, where=f"{field}.modifications"))
    msa = entity.get("msa")
    if msa is None or str(msa).strip().lower() == "empty" or kind != "protein":
        return sizes, 1
    msa_path = Path(str(msa)).expanduser()
    msa_path = msa_path if msa_path.is_absolute() else base / msa_path
    if msa_path.suffix.lower() != ".a3m":
        raise InputError(f"{field}.msa", f"{str(msa)!r}: an .a3m file or 'empty' is expected")
    return sizes, a3m_depth(msa_path, "".join(sequence.split()), f"{field}.msa")


def _ligand(entity: dict, field: str, ccd: ComponentsDictionary) -> Sizes:
    smiles, codes = entity.get("smiles"), entity.get("ccd")
    if (smiles is None) == (codes is None):
        raise InputError(field, "a ligand needs exactly one of smiles or ccd")
    if smiles is not None:
        return per_atom(smiles_heavy_atoms(smiles, f"{field}.smiles"))
    codes = codes if isinstance(codes, list) else [codes]
    ccd.load([str(c) for c in codes], f"{field}.ccd")
    return sum((per_atom(ccd.heavy_atoms(str(c), in_polymer=False, where=f"{field}.ccd")) for c in codes), Sizes())
