"""Driver-side planning: which files are journals, and how their bytes become tasks.

Only each file's first bytes are read here (its magic); big files are split: fixed-width
formats by arithmetic, variable-width formats at cached header-walk checkpoints
(:mod:`journalfs.spark.checkpoints`), so every slice has an exact start and ``seq``.
"""
from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from urllib.parse import unquote, urlsplit

from ..formats import CODECS, SNIFF_BYTES, detect, splittable
from ..fs.indexfiles import IndexCache
from ..journals import is_backup_name, open_path, sniff_fd
from .checkpoints import checkpoints
from .storage import is_remote, list_objects, read_head

MiB = 1 << 20


@dataclass(frozen=True)
class JournalFile:
    path: str
    format: str
    size: int


@dataclass(frozen=True)
class FileSlice:
    """Records of ``path`` that start in ``[start, stop)``; ``start`` None = the first record.

    ``seq`` is the ordinal of the record at ``start``.
    """

    path: str
    format: str
    start: int | None = None
    stop: int | None = None
    seq: int = 0
    #: (role, path) of the partner files the codec reads keys from (an akka data file's meta)
    partners: tuple[tuple[str, str], ...] = ()
    #: object storage settings (storage.s3_options) for s3:// paths; () for local files
    storage: tuple[tuple[str, str], ...] = ()


@dataclass
class Plan:
    files: list[JournalFile] = field(default_factory=list)
    groups: list[list[FileSlice]] = field(default_factory=list)


#: URI schemes read as local paths (s3:// and s3a:// are :mod:`journalfs.spark.storage`'s).
LOCAL_SCHEMES = ("file",)
#: Remote objects sniffed at once while listing (each one ranged read).
SNIFF_THREADS = 16
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


class NoJournalError(ValueError):
    """An input that holds no journal (an error: an empty result would hide a wrong path)."""


def local_path(location: str) -> str:
    """The absolute local path of ``location`` (a path or a ``file://`` URI); a clear error
    for a URI scheme journalfs cannot read and for a path that does not exist."""
    given = location
    m = _SCHEME.match(location)
    if m and len(m.group(1)) > 1:  # "C:" is no scheme, but there are no drives here anyway
        scheme = m.group(1).lower()
        if scheme not in LOCAL_SCHEMES:
            raise ValueError(f"{location}: unsupported URI scheme {scheme!r} (journalfs reads "
                             "local paths, file:// URIs and s3:// or s3a:// objects)")
        parts = urlsplit(location)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{location}: a file:// URI names a host ({parts.netloc}); "
                             "write file:///PATH")
        location = unquote(parts.path)
    path = os.path.abspath(location)
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, f"{given}: no such file or directory")
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"{given}: a dangling symbolic link")
    return path


def list_journals(root: str, recursive: bool = True, glob: str | None = None, *,
                  required: bool = False, storage: tuple = (),
                  unreadable: list[tuple[str, str]] | None = None) -> list[JournalFile]:
    """Every supported journal under ``root`` (a file or a directory, a path or a
    ``file://`` URI, or an ``s3://``/``s3a://`` object or prefix with ``storage`` settings),
    by content, sorted. ``required``: raise :class:`NoJournalError` (naming what was looked
    at) rather than return nothing. ``unreadable`` collects (path, reason) of the local
    files and directories that could not be read (permissions, I/O errors)."""
    if is_remote(root):
        return _list_objects(root, recursive, glob, required, storage)
    root = local_path(root)
    skipped = unreadable if unreadable is not None else []

    def cannot(exc: OSError) -> None:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EIO):
            skipped.append((exc.filename or "?", exc.strerror or str(exc)))

    if os.path.isfile(root):
        candidates = [root]
    elif recursive:
        candidates = []
        for d, dirs, files in os.walk(root, onerror=cannot):
            dirs.sort()
            candidates.extend(os.path.join(d, f) for f in sorted(files))
    else:
        candidates = sorted(os.path.join(root, f) for f in os.listdir(root)
                            if os.path.isfile(os.path.join(root, f)))
    out = []
    for path in candidates:
        name = os.path.basename(path)
        if is_backup_name(name):  # what `fsck --repair` kept: never a journal
            continue
        if glob and not fnmatch.fnmatch(name, glob):
            continue
        try:
            fd = open_path(path)
        except OSError as exc:  # not a regular file (EINVAL), gone, or unreadable
            exc.filename = path
            cannot(exc)
            continue
        try:
            codec = sniff_fd(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if codec is None:
            continue
        out.append(JournalFile(path, codec.name, size))
    if required and not out:
        raise NoJournalError(no_journal_message(root, candidates, glob))
    return out


def _list_objects(root: str, recursive: bool, glob: str | None, required: bool,
                  storage: tuple) -> list[JournalFile]:
    """:func:`list_journals` of object storage: one listing, then each candidate's first
    bytes by a ranged read (several at once)."""
    objects = list_objects(root, recursive, storage)
    candidates = [(uri, size) for uri, size in objects
                  if not is_backup_name(uri) and not (glob and not fnmatch.fnmatch(
                      uri.rpartition("/")[2], glob))]
    with ThreadPoolExecutor(SNIFF_THREADS) as pool:
        heads = list(pool.map(lambda c: read_head(c[0], SNIFF_BYTES, storage), candidates))
    out = []
    for (uri, size), head in zip(candidates, heads):
        codec = detect(head)
        if codec is not None:
            out.append(JournalFile(uri, codec.name, size))
    if required and not out:
        raise NoJournalError(no_journal_message(root, [u for u, _s in objects], glob,
                                                local=False))
    return out


def no_journal_message(root: str, candidates: list[str], glob: str | None,
                       local: bool = True) -> str:
    formats = ", ".join(sorted(CODECS))
    if candidates == [root]:
        if local and not os.access(root, os.R_OK):
            return f"{root}: permission denied"
        return f"{root}: not a journal (supported formats: {formats})"
    unreadable = sum(1 for c in candidates if not os.access(c, os.R_OK)) if local else 0
    matching = f" matching {glob!r}" if glob else ""
    return (f"{root}: no journal found ({len(candidates):,} files looked at{matching}"
            f"{f', {unreadable:,} unreadable' if unreadable else ''}; supported formats: "
            f"{formats})")


def partner_files(f: JournalFile, files: list[JournalFile],
                  by_dir: dict[str, list[tuple[str, str]]] | None = None,
                  storage: tuple = ()) -> dict[str, str]:
    """The partner files of ``f`` (by role, e.g. an akka data file's ``meta``) by its codec's
    rule, among the journals of its directory. ``by_dir`` (from :func:`siblings_by_dir`) saves
    a pass over ``files`` per call."""
    d, name = os.path.split(f.path)
    if by_dir is None:
        by_dir = siblings_by_dir(files)
    siblings = by_dir.get(d)
    if siblings is None or len(siblings) < 2:  # the listing may have been filtered
        siblings = [(os.path.basename(j.path), j.format)
                    for j in list_journals(d, recursive=False, storage=storage)]
    partners = CODECS[f.format].partners(name, [s for s in siblings if s[0] != name])
    return {role: os.path.join(d, other) for role, other in partners.items()}


def key_partners(f: JournalFile, files: list[JournalFile],
                 by_dir: dict[str, list[tuple[str, str]]] | None = None, storage: tuple = ()
                 ) -> tuple[tuple[str, str], ...]:
    """(role, path) of the partner files the codec of ``f`` reads its records' keys from."""
    roles = CODECS[f.format].key_partners
    if not roles:
        return ()
    return tuple((role, path) for role, path in partner_files(f, files, by_dir, storage).items()
                 if role in roles)


def siblings_by_dir(files: list[JournalFile]) -> dict[str, list[tuple[str, str]]]:
    by_dir: dict[str, list[tuple[str, str]]] = {}
    for j in files:
        d, name = os.path.split(j.path)
        by_dir.setdefault(d, []).append((name, j.format))
    return by_dir


#: Tasks per core: several, so that uneven tasks still keep every core busy to the end.
TASKS_PER_CORE = 4
#: Relative decoding cost per byte of a format that is not splittable (mostly small
#: records decoded one by one), against 1 for the others; only used to size and order tasks.
UNSPLITTABLE_COST_PER_BYTE = 5
#: Fixed cost of opening, mapping and converting one (small) file, in byte-equivalents.
FILE_COST = 32 << 10


def split_target(total_bytes: int, parallelism: int, max_bytes: int = 128 * MiB) -> int:
    """Bytes per task: about TASKS_PER_CORE tasks per core, within [1 MiB, max_bytes]."""
    return max(MiB, min(max_bytes, total_bytes // max(1, TASKS_PER_CORE * parallelism) + 1))


def cost(f: JournalFile) -> int:
    """Estimated work of reading ``f`` whole, in byte-equivalents."""
    return f.size * (1 if splittable(CODECS[f.format]) else UNSPLITTABLE_COST_PER_BYTE) + FILE_COST


def _fixed_slices(f: JournalFile, record_size: int, header: int, target: int) -> list[FileSlice]:
    count = max(0, (f.size - header) // record_size)
    per = max(1, target // record_size)
    slices = []
    for first in range(0, count, per):
        start = header + first * record_size
        stop = header + min(count, first + per) * record_size
        last = first + per >= count
        slices.append(FileSlice(f.path, f.format, start, None if last else stop, first))
    return slices or [FileSlice(f.path, f.format)]


def _checkpoint_slices(f: JournalFile, target: int, indexes,
                       partners: tuple[tuple[str, str], ...]) -> list[FileSlice]:
    points = checkpoints(f.path, f.format, target, indexes)
    if len(points) < 2:
        return [FileSlice(f.path, f.format, partners=partners)]
    ends = [p[0] for p in points[1:]] + [None]
    return [FileSlice(f.path, f.format, None if i == 0 else off, stop, seq, partners)
            for i, ((off, seq), stop) in enumerate(zip(points, ends))]


def slices_for(f: JournalFile, target: int, files: list[JournalFile],
               indexes=None,
               by_dir: dict[str, list[tuple[str, str]]] | None = None,
               storage: tuple = ()) -> list[FileSlice]:
    codec = CODECS[f.format]
    remote = is_remote(f.path)
    storage = storage if remote else ()
    partners = key_partners(f, files, by_dir, storage)
    if f.size <= target or not splittable(codec) or (remote and not codec.record_size):
        # an object of a variable-width format is one task: finding its record starts would
        # read it whole on the driver
        return [FileSlice(f.path, f.format, partners=partners, storage=storage)]
    if codec.record_size:
        return [replace(s, storage=storage)
                for s in _fixed_slices(f, codec.record_size, codec.header_size, target)]
    return _checkpoint_slices(f, target, indexes, partners)


def plan(files: list[JournalFile], parallelism: int, max_split: int = 128 * MiB,
         cache_dir: str | None = None, storage: tuple = ()) -> Plan:
    """Group small files into tasks of about ``split_target`` work; split big files (at
    checkpoints of their record indexes, kept in ``cache_dir``'s ``indexes/``: the user's
    cache directory is the CLI's; None: in memory only).

    Groups come out costliest first: Spark starts tasks in partition order, so the long ones
    start early and the short ones fill the cores at the end."""
    with contextlib.closing(IndexCache(cache_dir or "")) as indexes:
        return _plan(files, parallelism, max_split, indexes, storage)


def _plan(files: list[JournalFile], parallelism: int, max_split: int, indexes,
          storage: tuple) -> Plan:
    target = split_target(sum(cost(f) for f in files), parallelism, max_split)
    by_dir = siblings_by_dir(files)
    weighted: list[tuple[int, list[FileSlice]]] = []
    group: list[FileSlice] = []
    group_cost = 0
    for f in files:
        if f.size > target:
            slices = slices_for(f, target, files, indexes, by_dir, storage)
            each = cost(f) // len(slices)
            weighted.extend((each, [s]) for s in slices)
            continue
        group.extend(slices_for(f, target, files, indexes, by_dir, storage))
        group_cost += cost(f)
        if group_cost >= target:
            weighted.append((group_cost, group))
            group, group_cost = [], 0
    if group:
        weighted.append((group_cost, group))
    weighted.sort(key=lambda item: -item[0])  # stable: equal costs keep file order
    return Plan(files=files, groups=[g for _c, g in weighted])
