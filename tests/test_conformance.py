"""Every conformance file and byte vector decodes exactly as tests/data/conformance says.

The corpus is run through the real console script (as the acceptance check does) and through
the codecs in-process; the vectors through the codecs and the CLI's JSON encoding.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from codec_helpers import read_all
from conftest import CONFORMANCE
from test_records_cli import run_cli
from journalfs.formats import CODECS, detect, record_to_json


def records_cli(*argv: str) -> subprocess.CompletedProcess:
    """``journalfs records ARGV`` through the installed console script (as the acceptance
    check runs it)."""
    return run_cli("records", *argv, real=True)


def _expected_cases() -> list[str]:
    expected = CONFORMANCE / "records" / "expected.json"
    return sorted(json.loads(expected.read_text())) if expected.exists() else []


def _vector_cases() -> list[str]:
    vectors = CONFORMANCE / "vectors.json"
    return sorted(json.loads(vectors.read_text())) if vectors.exists() else []


def _comparable(got: list[dict], want: list[dict], fmt: str) -> list[dict]:
    """``got`` reduced to what the contract fixes: each expected record's fields, and for jrnl
    the op names only (per-op fields are the codec's to choose)."""
    out = []
    for i, g in enumerate(got):
        g = dict(g)
        if fmt == "jrnl":
            g["ops"] = [o.get("op") if isinstance(o, dict) else o for o in g.get("ops", [])]
        out.append({k: g.get(k) for k in want[i]} if i < len(want) else g)
    return out


@pytest.mark.parametrize("name", _expected_cases())
def test_cli_prints_expected_records(name, records_corpus, records_expected):
    want = records_expected[name]
    proc = records_cli(str(records_corpus / name), "--json")
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == want["exit"], proc.stderr
    assert _comparable(got, want["records"], want["format"]) == want["records"]
    assert all(set(g) >= {"format", "seq", "offset", "kind"} for g in got)
    if want["exit"] == 3:  # damage: exactly one clear line naming file and byte offset
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "byte" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        assert proc.stderr == ""


@pytest.mark.parametrize("name", _expected_cases())
def test_codec_reads_expected_records(name, records_corpus, records_expected):
    """The same corpus in-process: detection by magic, ``read`` and ``read_columns`` agree."""
    want = records_expected[name]
    data = (records_corpus / name).read_bytes()
    codec = detect(data[:64])
    assert codec is not None and codec.name == want["format"]
    records, error = read_all(codec, data, name)
    got = [record_to_json(r) for r in records]
    assert (error is not None) == (want["exit"] == 3)
    assert _comparable(got, want["records"], want["format"]) == want["records"]
    columns = codec.read_columns(data, name)
    assert columns.rows == len(got)
    assert (columns.error is not None) == (error is not None)
    assert list(columns.data["offset"]) == [r["offset"] for r in got]


@pytest.mark.parametrize("name", _vector_cases())
def test_vector_decodes_exactly(name, vectors, tmp_path):
    vector = vectors[name]
    data = bytes.fromhex(vector["hex"])
    assert len(data) == vector["length"]
    codec = CODECS[vector["format"]]
    assert detect(data[:64]) is codec
    assert [record_to_json(r) for r in codec.read(data, name)] == vector["records"]
    # and through the real CLI
    path = tmp_path / name.replace("/", "_")
    path.write_bytes(data)
    proc = records_cli(str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == vector["records"]


def test_non_journal_is_rejected_with_one_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some text, no magic here\n")
    proc = records_cli(str(path), "--json")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "not a supported journal" in proc.stderr


def test_missing_file_is_an_ordinary_error(tmp_path):
    proc = records_cli(str(tmp_path / "absent"))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
