"""mmCIF / PDB -> (tokens, atoms), parsed by gemmi.

The first model is tokenised as deposited: hydrogens, waters and alternative conformations
(beyond the first) are dropped. A standard residue or nucleotide is one token with its full
heavy-atom count from ``vocab.HEAVY_ATOMS`` (a residue with unresolved side-chain atoms still
carries them, as AF3's reference atoms do); any other residue -- ligand, ion, modified
residue -- gives one token per heavy atom present in the file. A structure has no MSA: S = 1.
"""

from __future__ import annotations

from pathlib import Path

from cpbench.data.chem import import_optional
from cpbench.data.tokenize import InputError, Sizes, per_atom, standard_residue
from cpbench.data.vocab import STANDARD_RESIDUES


def read_structure(path: Path) -> tuple[Sizes, int]:
    """Sizes of the first model of an mmCIF / PDB file and MSA depth 1."""
    gemmi = import_optional("gemmi", f"{path}")
    try:
        st = gemmi.read_structure(str(path))
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else exc
        raise InputError(f"{path}", f"gemmi cannot read the structure ({reason})") from None
    st.remove_hydrogens()
    st.remove_waters()
    st.remove_alternative_conformations()
    if len(st) == 0:
        raise InputError(f"{path}", "no model (no atoms) in the structure")
    total = Sizes()
    for chain in st[0]:
        for residue in chain:
            if residue.name in STANDARD_RESIDUES:
                total += standard_residue(residue.name)
            else:
                total += per_atom(len(residue))
    if total.tokens == 0:
        raise InputError(f"{path}", "no atoms besides hydrogens and waters in the first model")
    return total, 1
