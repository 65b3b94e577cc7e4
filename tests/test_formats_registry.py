"""Every registered format provides every capability the rest of journalfs asks of a codec, and
those facts agree with what the codec decodes (issue 13: each format's facts live in its codec)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from journalfs import demo
from journalfs.formats import CODECS, ColumnMap, Codec, splittable
from journalfs.journals import related_files, sniff_file

REPO = Path(__file__).resolve().parents[1]
TIME_UNITS = {"s", "ms", "us", "ns"}


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("demo")
    demo.write_demo(root)
    by_format: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        codec = sniff_file(str(path)) if path.is_file() else None
        if codec is not None:
            by_format.setdefault(codec.name, []).append(path)
    assert set(by_format) == set(CODECS)
    return by_format


@pytest.mark.parametrize("fmt", sorted(CODECS))
def test_every_format_provides_every_capability(fmt, demo_files):
    codec = CODECS[fmt]
    assert isinstance(codec, Codec) and codec.name == fmt
    assert codec.kinds and all(isinstance(k, str) for k in codec.kinds)
    assert isinstance(codec.columns, ColumnMap) and codec.columns.time_unit in TIME_UNITS
    assert isinstance(codec.in_file_order, bool) and isinstance(codec.resumable, bool)
    assert isinstance(codec.derived, bool)
    assert isinstance(codec.partner_formats, tuple) and set(codec.partner_formats) <= set(CODECS)
    assert codec.store_label is None or isinstance(codec.store_label, str)
    for method in ("sniff", "read", "read_columns", "write", "validate", "repair",
                   "file_key", "partners"):
        assert callable(getattr(codec, method)), method
    for path in demo_files[fmt]:
        data = path.read_bytes()
        assert codec.sniff(data[:64])
        records = list(codec.read(data, str(path)))
        assert records, path
        fields = set().union(*records)
        for column in (codec.columns.time, codec.columns.key, codec.columns.id):
            assert column is None or column == "seq" or column in fields, (column, fields)
        assert {r["kind"] for r in records} <= set(codec.kinds)
        offsets, next_offset, error = codec.record_offsets(data, str(path))
        assert list(map(int, offsets)) == [r["offset"] for r in records]
        assert next_offset is None and error is None
        if splittable(codec):  # a byte range holds a contiguous run: resume anywhere
            assert sorted(set(offsets)) == list(map(int, offsets))
            middle = len(records) // 2
            tail = list(codec.read(data, str(path), records[middle]["offset"], middle))
            assert tail == records[middle:]
        key = codec.file_key(path.name)
        assert key is None or isinstance(key, str)


@pytest.mark.parametrize("fmt", sorted(CODECS))
def test_partner_rule_is_the_codecs(fmt, demo_files):
    """The file-level helpers (fsck's context files) find exactly the partners the codec names."""
    codec = CODECS[fmt]
    for path in demo_files[fmt]:
        siblings = [(p.name, sniff_file(str(p)).name) for p in path.parent.iterdir()
                    if p != path and p.is_file() and sniff_file(str(p))]
        partners = codec.partners(path.name, siblings)
        assert {dict(siblings)[name] for name in partners.values()} <= set(codec.partner_formats)
        named = {role: str(path.parent / name) for role, name in partners.items()}
        assert named == related_files(str(path), codec), path


def test_kestrel_queue_names_come_from_the_codec():
    writer, reader = CODECS["kestrel-writer"], CODECS["kestrel-reader"]
    assert writer.file_key("jobs.1700000000000") == reader.file_key("jobs.read.indexer") == "jobs"
    assert reader.file_key("jobs.read.x~~123") is None
    assert CODECS["wallaby-log"].file_key("jobs.1700000000000") is None


#: Modules that must not name a format (spark/derived.py's tables are about one format each
#: by definition: it takes the names from the codec classes).
FORMAT_BLIND = ("spark/derived.py", "spark/read.py", "spark/plan.py", "spark/checkpoints.py", "spark/convert.py",
                "spark/source.py", "commands/records.py", "commands/pipeline.py",
                "commands/fsck.py", "journals.py", "selection.py", "fs/jsonlfollow.py")


@pytest.mark.parametrize("module", FORMAT_BLIND)
def test_no_format_is_named_outside_the_codecs(module):
    text = (REPO / "journalfs" / module).read_text()
    named = [fmt for fmt in CODECS if re.search(rf"[\"']{re.escape(fmt)}[\"'-]", text)]
    assert not named, f"{module} names {named}"
    assert os.path.basename(module) != "__init__.py"
