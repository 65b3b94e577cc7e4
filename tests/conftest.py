"""Fixtures shared by every test module: where ../shared's conformance data lives."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("JOURNALFS_SHARED", REPO.parent / "shared")).resolve()
CONFORMANCE = SHARED / "conformance"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"conformance data missing: {path} (set JOURNALFS_SHARED)")
    return path


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return _need(SHARED)


@pytest.fixture(scope="session")
def records_corpus() -> Path:
    """../shared/conformance/records (holds expected.json)."""
    return _need(CONFORMANCE / "records")


@pytest.fixture(scope="session")
def records_expected(records_corpus) -> dict:
    return json.loads((records_corpus / "expected.json").read_text())


@pytest.fixture(scope="session")
def vectors() -> dict:
    return json.loads(_need(CONFORMANCE / "vectors.json").read_text())


@pytest.fixture(scope="session")
def gvfs_snapshots() -> list[Path]:
    """Every snapshot directory of the real-gvfs corpora (each has gvfs-metadata/ and expected.json)."""
    snaps = sorted(_need(CONFORMANCE / "gvfs").glob("*/snapshots/*"))
    assert snaps, "no gvfs snapshots found"
    return snaps
