"""Every registered format provides every capability the rest of journalfs asks of a codec, and
those facts agree with what the codec decodes (issue 13: each format's facts live in its codec)."""
from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest

from journalfs import demo, formats
from journalfs.formats import CODECS, SNIFF_BYTES, ColumnMap, Codec, FormatError, splittable
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


@pytest.mark.parametrize("fmt", sorted(CODECS))
def test_every_format_gives_a_sample_file_of_the_size_asked(fmt):
    """bench/parse.py takes its inputs from Codec.sample_file alone (no table of its own):
    a valid file of about the records asked, the same for the same seed, growing with them."""
    codec = CODECS[fmt]
    data = codec.sample_file(random.Random(fmt), 300)
    assert data == codec.sample_file(random.Random(fmt), 300)
    assert codec.sniff(data[:SNIFF_BYTES])
    offsets, next_offset, error = codec.record_offsets(data, fmt)
    assert error is None and next_offset is None
    assert 250 <= len(offsets) <= 350, len(offsets)
    assert len(codec.sample_file(random.Random(fmt), 600)) > len(data)


def test_kestrel_queue_names_come_from_the_codec():
    writer, reader = CODECS["kestrel-writer"], CODECS["kestrel-reader"]
    assert writer.file_key("jobs.1700000000000") == reader.file_key("jobs.read.indexer") == "jobs"
    assert reader.file_key("jobs.read.x~~123") is None
    assert CODECS["wallaby-log"].file_key("jobs.1700000000000") is None


#: The only modules outside formats/ that may know particular formats (import a format's
#: module or codec class, name a format), and why. Every other module is format-blind: it
#: reaches the codecs only through the registry and the Codec interface.
FORMAT_AWARE = {
    "metastore/": "the gvfs-compatible store is the gvfs formats' own writer",
    "state.py": "each system's state (queues, chains, transactions), by the codecs' definitions",
    "fs/stateviews.py": "the mount's paths of state.py's states",
    "spark/derived.py": "the derived tables: each one is about one system by definition",
    "demo.py": "re-exports the formats' record generators to the tests and benches",
}
FORMAT_MODULES = {p.stem for p in (REPO / "journalfs" / "formats").glob("*.py")} - {"__init__"}
PUBLIC_FORMATS_NAMES = set(formats.__all__)


def _modules_outside_formats() -> list[str]:
    root = REPO / "journalfs"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                  if not p.relative_to(root).as_posix().startswith("formats/"))


def _format_imports(module: str, text: str | None = None) -> list[str]:
    """What ``module`` (its source: ``text``, else the file) imports of particular formats: a
    format's module (anything under formats/ but the interface, ``formats.base``), or a name
    of the registry's package that is not its public interface (a codec class there)."""
    if text is None:
        text = (REPO / "journalfs" / module).read_text()
    package = ["journalfs"] + module.split("/")[:-1]
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            target, names = "", []
            found += [a.name for a in node.names if a.name.startswith("journalfs.formats.")
                      and a.name != "journalfs.formats.base"]
        else:
            continue
        if target.startswith("journalfs.formats."):
            if target.split(".")[2] != "base":
                found.append(target)
        elif target == "journalfs.formats":
            found += [f"journalfs.formats.{n}" for n in names
                      if n in FORMAT_MODULES or n not in PUBLIC_FORMATS_NAMES]
    return found


def _aware(module: str) -> bool:
    return any(module == m or (m.endswith("/") and module.startswith(m)) for m in FORMAT_AWARE)


@pytest.mark.parametrize("module", [m for m in _modules_outside_formats() if not _aware(m)])
def test_format_blind_modules_neither_name_nor_import_a_format(module):
    text = (REPO / "journalfs" / module).read_text()
    named = [fmt for fmt in CODECS if re.search(rf"[\"']{re.escape(fmt)}[\"'-]", text)]
    assert not named, f"{module} names {named}"
    imported = _format_imports(module)
    assert not imported, f"{module} imports {imported}: only the registry and the Codec " \
        "interface (journalfs.formats, formats.base); or list it in FORMAT_AWARE with why"


def test_the_blind_check_catches_an_import_of_a_codec_class():
    """The check above fails for a module that imports a codec class (or a format's module),
    not only for one that spells a format's name."""
    for line in ("from ..formats.kestrel import KestrelWriter\n",
                 "from ..formats import KestrelWriter\n",
                 "from ..formats import gvfs_tree\n",
                 "import journalfs.formats.jrnl\n"):
        assert _format_imports("spark/probe.py", line), line
    assert not _format_imports("spark/probe.py", "from ..formats import CODECS, Codec\n"
                               "from ..formats.base import Columns\nfrom .. import formats\n")


def test_demo_shows_every_format_and_the_committed_demo_is_current(demo_files):
    """Every registered format has files in the demo (its codec's ``demo_files``: a new
    format needs nothing in demo.py), and demo/ in the repository is what
    ``python -m journalfs.demo demo`` writes now."""
    assert set(demo_files) == set(CODECS)
    committed = {p.relative_to(REPO / "demo").as_posix(): p.read_bytes()
                 for p in (REPO / "demo").rglob("*") if p.is_file()}
    assert committed == demo.demo_files(), "run: python -m journalfs.demo demo"


#: Probes of a codec left outside formats/, by module (none: the views ask ``codec.columnar``
#: since the split, fs/viewlisting.py). The test fails when one is added and when one is
#: removed without this list following.
PROBES_LEFT: dict[str, int] = {}


def _codec_probes(text: str) -> int:
    """``hasattr``/``getattr`` on a codec, or ``type(...)`` of one, in ``text``: the
    object is a name or attribute called ``codec`` (``codec``, ``self.codec``, ``idx.codec``)."""
    def is_codec(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "codec") or \
            (isinstance(node, ast.Attribute) and node.attr == "codec")
    found = 0
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("hasattr", "getattr", "type") and node.args \
                and is_codec(node.args[0]):
            found += 1
    return found


def test_no_module_asks_a_codec_what_it_has():
    """Callers use the Codec interface (issue 26): no hasattr/getattr/type() of a codec
    outside formats/ beyond PROBES_LEFT."""
    probes = {m: n for m in _modules_outside_formats()
              if (n := _codec_probes((REPO / "journalfs" / m).read_text()))}
    assert probes == PROBES_LEFT
    assert _codec_probes("hasattr(codec, 'x')\ngetattr(self.codec, 'y', None)\n"
                         "type(idx.codec).read_columns is C.read_columns\n") == 3


def test_a_format_must_provide_read_and_write_and_gets_the_rest():
    """The interface is enforced (abc): without read or write no codec can be made; with
    them, every other capability has a default built from them (a minimal format reads,
    scans, counts and renders like the others)."""
    class Unwritable(Codec):
        name, kinds, magics = "half", ("blob",), (b"HALF",)

        def read(self, buf, source, start=None, seq=0, stop=None):
            yield from ()

    with pytest.raises(TypeError):
        Unwritable()

    class Blobs(Unwritable):
        """One byte of length, then that many bytes; a length past the end is damage."""

        def read(self, buf, source, start=None, seq=0, stop=None):
            pos = 4 if start is None else start
            while pos < len(buf) and (stop is None or pos < stop):
                end = pos + 1 + buf[pos]
                if end > len(buf):
                    raise FormatError(source, pos, "torn blob")
                yield {"format": self.name, "seq": seq, "offset": pos, "kind": "blob",
                       "payload": bytes(buf[pos + 1:end])}
                pos, seq = end, seq + 1

        def write(self, records, **header):
            return b"HALF" + b"".join(bytes([len(r["payload"])]) + r["payload"]
                                      for r in records)

    codec = Blobs()
    assert not codec.columnar and not codec.paces_validation and codec.demo_files(None, []) == {}
    data = codec.write([{"payload": bytes([n]) * n} for n in range(40)]) + b"\x09x"
    records = []
    with pytest.raises(FormatError):
        records.extend(codec.read(data, "f"))
    offsets, next_offset, error = codec.record_offsets(data, "f", limit=7)
    assert list(offsets) == [r["offset"] for r in records[:7]] and next_offset == records[7]["offset"]
    batches = list(codec.scan(data, "f", rows=16, span=64))
    assert sum(b.rows for b in batches) == len(records) and batches[-1].error.offset == len(data) - 2
    assert [int(o) for b in batches for o in b.data["offset"]] == [r["offset"] for r in records]
    assert [int(o) for b in codec.scan(data, "f", form="offsets") for o in b.data["offset"]] \
        == [r["offset"] for r in records]
