"""Every ``scripts/<name>.py|.sh`` the README, the docs, the package, the tests or CI name exists:
a script that is removed or renamed takes its references with it. The records under
``docs/benchmarks/`` are not checked: they name the scripts that made them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_REF = re.compile(r"\bscripts/([A-Za-z0-9_]+\.(?:py|sh))\b")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("cpbench", "tests", "scripts", ".ci"):
        files += sorted(p for p in (ROOT / top).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".png"))
    return [p for p in files if p.exists()]


def test_every_script_named_exists():
    missing = []
    for path in _texts():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for m in SCRIPT_REF.finditer(text):
            if not (ROOT / "scripts" / m.group(1)).exists():
                missing.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}")
    assert not missing, "references to scripts that do not exist:\n" + "\n".join(missing)
