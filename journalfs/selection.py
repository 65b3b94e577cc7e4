"""Selecting and following records of journal files: what ``journalfs records`` and the state
commands ask of files on disk, format-blind (the codecs say where a record's time and key are).

- :func:`expand_sources`: files, directories and Kestrel-style queues (``DIR/jobs``: every
  journal of ``DIR`` whose codec names ``jobs`` as its file key) as a list of journal files.
- :func:`parse_time` and :func:`format_time`: journalctl's time syntax, and ISO-8601 output.
- :class:`RecordFilter`: kinds, key, a regular expression, a time range.
- :class:`FileRecords`: one file's records by sequence number through its record index:
  a range is decoded from the checkpoint before it, and only the records it holds are made
  into records (``-n 10`` of a 1 GB journal decodes ten records); times are found by bisection
  over the checkpoints.
- :class:`Follower`: new records of growing files, with truncation, rotation, removal and new
  files reported as :class:`Notice` values.

Files are read with pread into anonymous memory, never mapped: a file truncated meanwhile only
reads short (the codec reports damage), it cannot kill the process with SIGBUS.
"""
from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import decimal
import os
import re
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from .formats import Codec, FormatError
from .formats.base import Record
from .journals import (FINGERPRINT_BYTES, RecordIndex, is_backup_name, open_path,
                       pread_buffer, related_files, sniff_fd, sniff_file)
from .jsonlines import record_line

NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


# -- which files --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """One journal file to read, with the codec its content names."""

    path: str
    codec: Codec


class SourceGroup:
    """What one command-line argument names: a file, a directory (its journals, recursively)
    or a queue ``DIR/Q`` (the journals of DIR whose codec's :meth:`~Codec.file_key` is Q).
    :meth:`scan` lists them again (a followed queue gains segments, a directory files)."""

    def __init__(self, arg: str):
        self.arg = arg
        self.kind = "file"
        if os.path.isdir(arg):
            self.kind = "dir"
        elif not os.path.lexists(arg) and _queue_members(arg):
            self.kind = "queue"
        self._codecs: dict[str, Codec | None] = {}

    def scan(self) -> list[Source]:
        if self.kind == "file":
            codec = sniff_file(self.arg)
            if codec is None:
                return []
            return [Source(self.arg, codec)]
        names = (_queue_members(self.arg) if self.kind == "queue" else _walk(self.arg))
        found = []
        for path in names:
            if path not in self._codecs:
                self._codecs[path] = sniff_file(path)
            codec = self._codecs[path]
            if codec is not None:
                found.append(Source(path, codec))
        return found


def natural_key(name: str) -> list:
    """``jobs.9`` before ``jobs.10``: digit runs compare as numbers (Kestrel's segments and
    any numbered rotation), everything else as text."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name) if part]


def _walk(top: str) -> list[str]:
    out = []
    for directory, dirs, files in os.walk(top):
        dirs.sort(key=natural_key)
        for name in sorted(files, key=natural_key):
            if not is_backup_name(name):
                out.append(os.path.join(directory, name))
    return out


def _queue_members(arg: str) -> list[str]:
    directory, queue = os.path.split(arg)
    if not queue:
        return []
    try:
        names = sorted(os.listdir(directory or "."), key=natural_key)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.startswith(queue) or is_backup_name(name):
            continue
        path = os.path.join(directory, name)
        codec = sniff_file(path)
        if codec is not None and codec.file_key(name) == queue:
            out.append(path)
    return out


def expand_sources(args: Sequence[str]) -> tuple[list[SourceGroup], list[Source]]:
    """The groups the arguments name and their journal files, in order (a file named twice is
    read once). A named file that is not a journal is damaged input (FormatError); a missing
    one an OSError."""
    groups, sources, seen = [], [], set()
    for arg in args:
        group = SourceGroup(arg)
        if group.kind == "file":
            with open(arg, "rb"):  # missing or unreadable: an ordinary error, named
                pass
            if sniff_file(arg) is None:
                raise FormatError(arg, 0, "not a supported journal (unknown magic bytes)")
        groups.append(group)
        for src in group.scan():
            if src.path not in seen:
                seen.add(src.path)
                sources.append(src)
    return groups, sources


# -- times ------------------------------------------------------------------------------------

_UNITS = {
    "us": 1_000, "usec": 1_000, "ms": 1_000_000, "msec": 1_000_000,
    "s": 10**9, "sec": 10**9, "second": 10**9, "seconds": 10**9,
    "m": 60 * 10**9, "min": 60 * 10**9, "minute": 60 * 10**9, "minutes": 60 * 10**9,
    "h": 3600 * 10**9, "hr": 3600 * 10**9, "hour": 3600 * 10**9, "hours": 3600 * 10**9,
    "d": 86400 * 10**9, "day": 86400 * 10**9, "days": 86400 * 10**9,
    "w": 7 * 86400 * 10**9, "week": 7 * 86400 * 10**9, "weeks": 7 * 86400 * 10**9,
}
_SPAN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)")


def _span_ns(text: str) -> int:
    """``1h30min``, ``10 min``, ``90`` (seconds) as nanoseconds."""
    total, pos, text = 0, 0, text.strip()
    if not text:
        raise ValueError("empty time span")
    while pos < len(text):
        m = _SPAN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"not a time span: {text!r}")
        unit = m.group(2) or "s"
        if unit not in _UNITS:
            raise ValueError(f"unknown time unit {unit!r} in {text!r}")
        total += int(decimal.Decimal(m.group(1)) * _UNITS[unit])
        pos = m.end()
    return total


def parse_time(text: str, utc: bool = False, now_ns: int | None = None) -> int:
    """A point in time, as journalctl's ``--since``/``--until`` take it, in ns since the
    epoch: ``now``, ``today``, ``yesterday``, ``tomorrow``; relative ``-10min``, ``+1h``,
    ``10min ago``; ``@EPOCH`` seconds; ISO-8601 dates and times (``2026-11-27``,
    ``2026-11-27 10:00``, ``2026-11-27T10:00:00.5Z``, ``10:00`` = today). Times without a
    zone are local, or UTC with ``utc``. ValueError names what cannot be read."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    raw = text
    text = text.strip().lower()
    zone = dt.timezone.utc if utc else None
    if text == "now":
        return now_ns
    if text in ("today", "yesterday", "tomorrow"):
        now = dt.datetime.fromtimestamp(now_ns / 1e9, zone or dt.datetime.now().astimezone().tzinfo)
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if not utc:  # a day may not be 24 h (daylight saving): local midnight of that date
            midnight = midnight.replace(tzinfo=None)
        days = {"today": 0, "yesterday": -1, "tomorrow": 1}[text]
        day = midnight + dt.timedelta(days=days)
        return _to_ns(day if day.tzinfo else day.astimezone())
    if text.startswith("@"):
        try:
            return int(decimal.Decimal(text[1:]) * 10**9)  # exact: ns need 19 digits
        except (decimal.InvalidOperation, ValueError):
            raise ValueError(f"not a time: {raw!r}") from None
    if text[:1] in "+-":
        span = _span_ns(text[1:])
        return now_ns + span if text[0] == "+" else now_ns - span
    if text.endswith(" ago"):
        return now_ns - _span_ns(text[:-4])
    if text.endswith(" left"):
        return now_ns + _span_ns(text[:-5])
    try:
        when = _iso(raw.strip())
    except ValueError:
        raise ValueError(f"not a time: {raw!r} (ISO-8601, -10min, today, yesterday, @EPOCH)") \
            from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc) if utc else when.astimezone()
    return _to_ns(when)


def _iso(text: str) -> dt.datetime:
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?", text):  # a time today
        today = dt.date.today()
        return dt.datetime.fromisoformat(f"{today.isoformat()}T{text.zfill(5) if len(text) < 5 else text}")
    return dt.datetime.fromisoformat(text.replace(" ", "T", 1) if " " in text else text)


def _to_ns(when: dt.datetime) -> int:
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000


def record_time_ns(codec: Codec, rec: Record) -> int | None:
    """The record's own time (the codec's ``columns.time`` field) in ns; None without one."""
    name = codec.columns.time
    value = rec.get(name) if name else None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return value * NS[codec.columns.time_unit]


_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def format_time(ns: int | None, unit: str = "ns", utc: bool = False) -> str:
    """ISO-8601 with as many fraction digits as ``unit`` has (``Z`` for UTC, else the local
    offset); a value no calendar holds (hostile input) is shown as the raw number."""
    if ns is None:
        return "-"
    try:
        secs, frac = divmod(ns, 10**9)
        when = dt.datetime.fromtimestamp(secs, dt.timezone.utc if utc else None)
        if not utc:
            when = when.astimezone()
    except (OverflowError, ValueError, OSError):
        return str(ns // NS.get(unit, 1))
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    digits = _DIGITS.get(unit, 9)
    if digits:
        text += "." + f"{frac:09d}"[:digits]
    if utc:
        return text + "Z"
    offset = when.strftime("%z")
    return text + offset[:3] + ":" + offset[3:]


# -- which records ------------------------------------------------------------------------------

@dataclass
class RecordFilter:
    """The content filters: every record shown passes all of them."""

    kinds: frozenset[str] | None = None
    key: str | None = None
    grep: re.Pattern | None = None
    since_ns: int | None = None
    until_ns: int | None = None

    @property
    def by_time(self) -> bool:
        return self.since_ns is not None or self.until_ns is not None

    @property
    def active(self) -> bool:
        return bool(self.kinds or self.key is not None or self.grep or self.by_time)

    def matches(self, codec: Codec, rec: Record, key: str | None = None) -> bool:
        if self.kinds and rec.get("kind") not in self.kinds:
            return False
        if self.by_time:
            ns = record_time_ns(codec, rec)
            if ns is None or (self.since_ns is not None and ns < self.since_ns) \
                    or (self.until_ns is not None and ns > self.until_ns):
                return False
        if self.key is not None and key != self.key:
            return False
        if self.grep is not None and not self.grep.search(record_line(rec, "auto")):
            return False
        return True


class Keys:
    """The key of each record of one file (``--key``): a field of the record, the file's name
    (a queue), or, for records whose key only a partner file names, the codec's resolver over
    the whole file (akka chains)."""

    def __init__(self, source: Source):
        self.codec, self.path = source.codec, source.path
        self.field = source.codec.columns.key
        self.file_key = source.codec.file_key(os.path.basename(source.path))
        self._by_offset: dict[int, str | None] | None = None

    def __call__(self, rec: Record) -> str | None:
        if self.field:
            value = rec.get(self.field)
            return value if isinstance(value, str) else None
        if self.file_key is not None:
            return self.file_key
        if self.codec.key_partners:
            if self._by_offset is None:
                self._by_offset = self._resolve()
            return self._by_offset.get(rec.get("offset"))
        return None

    def _resolve(self) -> dict[int, str | None]:
        partners = related_files(self.path, self.codec)
        out: dict[int, str | None] = {}
        with contextlib.ExitStack() as stack:
            bufs = {}
            for role in self.codec.key_partners:
                if role in partners:
                    with contextlib.suppress(OSError):
                        bufs[role] = stack.enter_context(_whole(partners[role]))
            buf = stack.enter_context(_whole(self.path))
            resolver = self.codec.key_resolver(buf, bufs)
            if resolver is None:
                return out
            start, seq = None, 0
            while True:
                cols = self.codec.read_columns(buf, self.path, start, seq, None, 1 << 14)
                if cols.rows:
                    for off, key in zip(list(cols.data["offset"]), resolver(cols.data)):
                        out[int(off)] = key
                if cols.error is not None or cols.next_offset is None or not cols.rows:
                    return out
                start, seq = cols.next_offset, cols.next_seq


@contextlib.contextmanager
def _whole(path: str):
    fd = open_path(path)
    try:
        size = os.fstat(fd).st_size
        with pread_buffer(fd, 0, size, size) as buf:
            yield buf
    finally:
        os.close(fd)


# -- one file's records by sequence number --------------------------------------------------------

#: Opens (or loads, or extends) the record index of a file; the CLI keeps them on disk.
IndexOf = Callable[[Source], RecordIndex]


def build_index(source: Source) -> RecordIndex:
    return RecordIndex.build(source.path, source.codec, opener=lambda: open_path(source.path))


class FileRecords:
    """The records of one file through its :class:`RecordIndex`: ``count``, ranges forward
    and backward, and the sequence numbers where a time range starts and ends."""

    def __init__(self, source: Source, index: RecordIndex | Callable[[], RecordIndex]):
        """``index``: the file's index, or a function making it when first needed (a
        selection over many files indexes only those it reaches)."""
        self.source, self.codec, self.path = source, source.codec, source.path
        self._index = index

    @property
    def index(self) -> RecordIndex:
        if callable(self._index):
            self._index = self._index()
        return self._index

    @property
    def indexed(self) -> bool:
        return not callable(self._index)

    @property
    def count(self) -> int:
        return self.index.count

    @property
    def error(self) -> FormatError | None:
        return self.index.error

    # -- where records start -------------------------------------------------------------
    def _seekable(self) -> bool:
        return self.codec.resumable and bool(self.index.seqs)

    def _checkpoint(self, seq: int) -> int:
        return bisect.bisect_right(self.index.seqs, seq) - 1

    def _exact_start(self, fd: int, size: int, seq: int) -> int:
        """The byte offset of record ``seq``: from the checkpoint before it, the codec's record
        starts (found without decoding the records between)."""
        i = self._checkpoint(seq)
        start, at = self.index.offsets[i], self.index.seqs[i]
        if at == seq:
            return start
        stop = self.index.offsets[i + 1] if i + 1 < len(self.index.offsets) else size
        with pread_buffer(fd, start, stop, size) as buf:
            offsets, _next, _err = self.codec.record_offsets(buf, self.path, start, at, stop,
                                                             seq - at + 1)
        if len(offsets) <= seq - at:
            raise FormatError(self.path, start, "the file changed since it was indexed")
        return int(offsets[seq - at])

    def _open(self):
        return contextlib.closing(_Fd(open_path(self.path)))

    # -- ranges ------------------------------------------------------------------------------
    def forward(self, lo: int = 0, hi: int | None = None) -> Iterator[Record]:
        """Records ``lo .. hi-1`` in file order, decoded a checkpoint's span at a time."""
        hi = self.count if hi is None else min(hi, self.count)
        if lo >= hi:
            return
        if not self._seekable():
            yield from self.index.records(lo, hi - lo)
            return
        with self._open() as f:
            size = os.fstat(f.fd).st_size
            start = self._exact_start(f.fd, size, lo)
            seq, i = lo, self._checkpoint(lo)
            while seq < hi:
                stop = self.index.offsets[i + 1] if i + 1 < len(self.index.offsets) else None
                end = size if stop is None else min(stop, size)
                with pread_buffer(f.fd, start, end, size) as buf:
                    it = self.codec.read(buf, self.path, start, seq, stop)
                    try:
                        for rec in it:
                            if rec["seq"] >= hi:
                                return
                            yield rec
                            seq = rec["seq"] + 1
                    except FormatError:
                        return  # the index holds the damage; the records before it were served
                    finally:
                        it.close()
                if stop is None:
                    return
                i += 1
                start, seq = stop, self.index.seqs[i]

    def backward(self, lo: int = 0, hi: int | None = None) -> Iterator[list[Record]]:
        """Records ``lo .. hi-1`` in pieces from the end: each piece in file order, the pieces
        last first (a checkpoint's span each)."""
        hi = self.count if hi is None else min(hi, self.count)
        if lo >= hi:
            return
        if not self._seekable():
            yield list(self.index.records(lo, hi - lo))
            return
        i = self._checkpoint(hi - 1)
        while hi > lo:
            first = max(lo, self.index.seqs[i])
            yield list(self.forward(first, hi))
            hi, i = first, i - 1

    # -- time bounds ---------------------------------------------------------------------------
    def time_bounds(self, since_ns: int | None, until_ns: int | None) -> tuple[int, int]:
        """``(lo, hi)``: the records that may lie in the time range, found by bisection over
        the checkpoints' times (as journalctl bisects its entry arrays: times are taken to grow
        with the file). The records in between are still checked one by one."""
        lo, hi = 0, self.count
        if self.codec.columns.time is None:
            return (0, 0) if since_ns is not None or until_ns is not None else (0, hi)
        if not self._seekable() or len(self.index.seqs) < 2:
            return lo, hi
        times = _CheckpointTimes(self)
        n = len(self.index.seqs)
        if since_ns is not None:
            # the last checkpoint whose time is before since: records from it on
            k = _bisect(n, lambda j: times[j] is not None and times[j] >= since_ns) - 1
            lo = self.index.seqs[max(k, 0)]
        if until_ns is not None:
            # the first checkpoint whose time is after until: records before it
            k = _bisect(n, lambda j: times[j] is not None and times[j] > until_ns)
            hi = self.index.seqs[k] if k < n else self.count
        return lo, max(lo, hi)


class _Fd:
    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def _bisect(n: int, after: Callable[[int], bool]) -> int:
    """The first j in [0, n) with ``after(j)`` (n when none), ``after`` taken as monotonic."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if after(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class _CheckpointTimes:
    """The time of each checkpoint's record, decoded when first asked (a bisection asks ~20)."""

    def __init__(self, records: FileRecords):
        self.records = records
        self.cache: dict[int, int | None] = {}

    def __getitem__(self, j: int) -> int | None:
        if j not in self.cache:
            seq = self.records.index.seqs[j]
            rec = next(iter(self.records.forward(seq, seq + 1)), None)
            self.cache[j] = None if rec is None else record_time_ns(self.records.codec, rec)
        return self.cache[j]


# -- following ------------------------------------------------------------------------------------

@dataclass
class Notice:
    """Something a follower reports besides records (on stderr)."""

    path: str
    text: str


@dataclass
class _Followed:
    source: Source
    fd: int
    ino: tuple[int, int]
    #: the last record known: (its offset, its seq) -- decoding resumes there -- or None
    last: tuple[int, int] | None = None
    size: int = 0
    mtime_ns: int = 0
    head_crc: int = 0
    #: the damage met at the tail, and since when (a torn append is usually completed soon)
    stalled: tuple[int, str] | None = None
    stalled_since: float = 0.0
    reported: bool = False
    gone: bool = False


#: Bytes of a followed file read at a time when much was appended at once.
FOLLOW_WINDOW = 16 << 20
#: How often a followed directory or queue is listed again for new files (a directory tree
#: is walked: not at every poll).
GROUP_SCAN_INTERVAL = 0.15
#: How long a record that cannot be decoded may stay at a growing file's end before it is
#: reported as damage (a writer is usually in the middle of appending it).
TORN_GRACE = 1.0


class Follower:
    """New records of followed files: :meth:`poll` returns what appeared since the last call,
    as ``(source, record)`` pairs and :class:`Notice` values, in order.

    A file that grows is read from its last known record on. One that shrank or whose first
    bytes changed was truncated or rewritten: reported, then read from its start. One whose
    path now names another file was rotated: the old file is read to its end, then the new one
    from its start. Groups (a queue, a directory) are scanned for new files."""

    def __init__(self, groups: Sequence[SourceGroup]):
        self.groups = list(groups)
        self.files: dict[str, _Followed] = {}
        self._scanned = 0.0

    def start(self, source: Source, last: tuple[int, int] | None,
              seen: tuple[int, int, int] | None = None) -> None:
        """Follow ``source`` from after ``last`` (offset, seq of its last record; None: it
        has none). ``seen``: (inode, size, mtime_ns) of the file when ``last`` was found
        (its index's identity): whatever came after that is new."""
        fd = open_path(source.path)
        st = os.fstat(fd)
        size, mtime = (st.st_size, st.st_mtime_ns) if seen is None else (seen[1], seen[2])
        if seen is not None and seen[0] != st.st_ino:  # replaced meanwhile: all of it is new
            last, size, mtime = None, -1, 0
        f = _Followed(source, fd, (st.st_dev, st.st_ino), last, size, mtime,
                      _head_crc(fd, last[0] if last else 0))
        self.files[source.path] = f

    def close(self) -> None:
        for f in self.files.values():
            with contextlib.suppress(OSError):
                os.close(f.fd)
        self.files.clear()

    def poll(self) -> Iterator[tuple[Source, Record] | Notice]:
        for path in list(self.files):
            yield from self._poll_file(self.files[path])
        now = time.monotonic()
        if now - self._scanned < GROUP_SCAN_INTERVAL:
            return
        self._scanned = now
        for group in self.groups:
            if group.kind == "file":
                continue
            for src in group.scan():
                if src.path not in self.files:
                    try:
                        self.start(src, None, (0, -1, 0))
                    except OSError:
                        continue
                    yield Notice(src.path, "new file")
                    yield from self._poll_file(self.files[src.path], force=True)

    def _poll_file(self, f: _Followed, force: bool = False):
        path = f.source.path
        try:
            st = os.stat(path)
            now_ino = (st.st_dev, st.st_ino)
        except OSError:
            now_ino = None
        if now_ino is not None and now_ino != f.ino:
            # rotated: what the old file got before it was replaced, then the new one
            yield from self._read_new(f)
            os.close(f.fd)
            try:
                fd = open_path(path)
            except OSError:
                f.gone = True
                return
            codec = sniff_fd(fd) or f.source.codec
            st = os.fstat(fd)
            f.source = Source(path, codec)
            f.fd, f.ino, f.last, f.size, f.mtime_ns = fd, (st.st_dev, st.st_ino), None, -1, 0
            f.stalled, f.reported, f.gone = None, False, False
            yield Notice(path, "replaced (rotated): following the new file")
            yield from self._read_new(f, force=True)
            return
        if now_ino is None and not f.gone:
            f.gone = True
            yield Notice(path, "removed: following it until it is replaced")
        yield from self._read_new(f, force=force)

    def _read_new(self, f: _Followed, force: bool = False):
        try:
            st = os.fstat(f.fd)
        except OSError:
            return
        changed = force or st.st_size != f.size or st.st_mtime_ns != f.mtime_ns
        if not changed:
            if f.stalled is not None and not f.reported and \
                    time.monotonic() - f.stalled_since >= TORN_GRACE:
                f.reported = True
                yield Notice(f.source.path, f"damaged at byte {f.stalled[0]}: {f.stalled[1]} "
                                            "(waiting for the writer)")
            return
        known_end = f.last[0] if f.last else 0
        if st.st_size < f.size or st.st_size < known_end or \
                (f.last and _head_crc(f.fd, known_end) != f.head_crc):
            # shorter is a truncation; as long or longer with other bytes before the last
            # record read is a rewrite in place (a SQLite WAL reset, a log reused from byte 0)
            what = "truncated" if st.st_size < max(f.size, known_end) else "rewritten in place"
            yield Notice(f.source.path, f"{what} (was {f.size} bytes, now {st.st_size}): "
                                        "reading it from its start")
            f.last, f.stalled, f.reported = None, None, False
        f.size, f.mtime_ns = st.st_size, st.st_mtime_ns
        codec = f.source.codec
        if not codec.resumable:  # rewritten as a whole (a tree): all of it again
            if f.last is not None:
                yield Notice(f.source.path, "rewritten: reading it from its start")
            start, seq = None, 0
        else:
            start, seq = (f.last if f.last else (None, 0))
        skip = f.last[1] if (f.last and codec.resumable) else -1
        size, width = st.st_size, FOLLOW_WINDOW
        while True:
            # a window of the file read as if the file ended there (memory stays a window
            # however much was appended); a record reaching past it is read again with the
            # next window, which starts at the last record decoded (or is twice as wide)
            lo = start or 0
            end = min(size, lo + width) if codec.resumable else size
            error = None
            try:
                with pread_buffer(f.fd, lo, end, end) as buf:
                    it = codec.read(buf, f.source.path, start, seq)
                    try:
                        for rec in it:
                            f.last = (rec["offset"], rec["seq"])
                            if rec["seq"] > skip:
                                skip = rec["seq"]
                                yield f.source, rec
                    finally:
                        it.close()
            except FormatError as exc:
                error = exc
            if end >= size:
                break
            if f.last is not None and f.last[0] > lo:
                start, seq = f.last
                width = FOLLOW_WINDOW
            else:
                width *= 2
        if error is None:
            f.stalled = None
        else:
            where = (error.offset, error.reason)
            if f.stalled != where:
                f.stalled, f.stalled_since, f.reported = where, time.monotonic(), False
        f.head_crc = _head_crc(f.fd, f.last[0] if f.last else 0)


def _head_crc(fd: int, upto: int) -> int:
    """crc32 of the file's first bytes (up to ``upto``, at most FINGERPRINT_BYTES): a file
    truncated and written again almost surely changes them."""
    n = min(upto, FINGERPRINT_BYTES)
    try:
        return zlib.crc32(os.pread(fd, n, 0)) if n else 0
    except OSError:
        return 0


__all__ = ["FileRecords", "Follower", "Keys", "Notice", "RecordFilter", "Source", "SourceGroup",
           "build_index", "expand_sources", "format_time", "natural_key", "parse_time",
           "record_time_ns"]
