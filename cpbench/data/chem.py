"""Heavy-atom counts of ligands: SMILES through RDKit, CCD codes through a components dictionary.

Both parsers are optional dependencies (``pip install cpbench[real]``); they are imported
only when an input needs them.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from cpbench.data.tokenize import InputError


def import_optional(module: str, needed_for: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise InputError(needed_for, f"needs the {module.split('.')[0]} package: pip install 'cpbench[real]'") from None


def smiles_heavy_atoms(smiles: str, where: str) -> int:
    """Heavy atoms of a SMILES ligand (RDKit; explicit hydrogens do not count)."""
    chem = import_optional("rdkit.Chem", where)
    import_optional("rdkit.RDLogger", where).DisableLog("rdApp.*")  # the error below says it in one line
    mol = chem.MolFromSmiles(str(smiles)) if str(smiles).strip() else None
    if mol is None:
        raise InputError(where, f"RDKit cannot parse SMILES {str(smiles)!r}")
    return mol.GetNumHeavyAtoms()


class ComponentsDictionary:
    """CCD components (wwPDB ``components.cif`` or ``.cif.gz``, or any excerpt of it).

    Only the requested codes are parsed (through gemmi): the file is scanned once for their
    ``data_CODE`` blocks, so the full 400 MB dictionary costs one pass, not a full parse.
    """

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._heavy: dict[str, tuple[int, int]] = {}  # code -> (all heavy, non-leaving heavy)

    def heavy_atoms(self, code: str, in_polymer: bool, where: str) -> int:
        """Heavy atoms of component ``code``; in a polymer its leaving atoms (OXT, ...) go.

        Raises:
            InputError: no dictionary configured (``dataset.ccd``), or ``code`` is not in it.
        """
        code = str(code).strip().upper()
        if code not in self._heavy:
            self.load([code], where)
        every, kept = self._heavy[code]
        return kept if in_polymer else every

    def load(self, codes: list[str], where: str) -> None:
        """Parse the blocks of ``codes`` (a missing code is an error naming it)."""
        wanted = {c.upper() for c in codes} - set(self._heavy)
        if not wanted:
            return
        if self.path is None:
            raise InputError(where, f"CCD code {sorted(wanted)[0]!r} needs a components dictionary: "
                                    "set dataset.ccd=PATH/components.cif")
        cif = import_optional("gemmi", where).cif
        try:
            text = self._blocks_text(wanted)
        except OSError as exc:
            raise InputError(f"{self.path}",
                             f"dataset.ccd: cannot read the components dictionary ({exc.strerror or exc})") from None
        doc = cif.read_string(text) if text else []
        for block in doc:
            table = block.find("_chem_comp_atom.", ["type_symbol", "?pdbx_leaving_atom_flag"])
            every = kept = 0
            for row in table:
                if row[0].upper() in ("H", "D"):
                    continue
                every += 1
                kept += not (row.has(1) and row[1].upper() == "Y")
            self._heavy[block.name.upper()] = (every, kept)
        missing = wanted - set(self._heavy)
        if missing:
            raise InputError(where, f"CCD code {sorted(missing)[0]!r} is not in {self.path}")

    def _blocks_text(self, wanted: set[str]) -> str:
        opener = gzip.open if self.path.suffix == ".gz" else open
        chunks, keep = [], False
        with opener(self.path, "rt") as f:
            for line in f:
                if line.startswith("data_"):
                    keep = line[5:].strip().upper() in wanted
                if keep:
                    chunks.append(line)
        return "".join(chunks)
