"""ARCHITECTURE.md's table of fs/ modules names every module of journalfs/fs/, and only those:
a module split out or added without its line there fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def test_the_fs_module_table_names_every_fs_module():
    text = (REPO / "ARCHITECTURE.md").read_text()
    section = text.split("## fs/: one module per job", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([a-z_]+\.py)`", line.split(" | ")[0])}
    present = {p.name for p in (REPO / "journalfs" / "fs").glob("*.py")} - {"__init__.py"}
    assert sorted(present - named) == [], "fs/ modules missing from ARCHITECTURE.md's table"
    assert sorted(named - present) == [], "ARCHITECTURE.md's table names modules that are gone"
