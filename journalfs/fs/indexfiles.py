"""Record indexes of SOURCE journals kept on disk, in ``<store dir>/indexes/`` (never in SOURCE).

A remount then finds any record of a big journal without reading the journal again (as
ratarmount keeps ``.index.sqlite`` next to its archives). One file per journal, named by the
journal's identity ``<st_dev>-<st_ino>.jfsidx``::

    b"JFSIDX1\\n"
    one JSON line: codec, dev, ino, size, mtime_ns, head_crc (crc32 of the first 4 KiB),
                   fingerprint, count, error, checkpoints, layout_rows, layout_size
    int64 LE arrays: checkpoint seqs, checkpoint offsets, records.jsonl line seqs, their offsets

An index is used as is when the journal's dev, inode, size, mtime and first bytes are those it
was taken of; when only the size grew (same inode and start, same bytes before the last
checkpoint) it is the starting point of :meth:`RecordIndex.build`, which indexes only the
growth. Files are written to a temporary name and renamed, all relative to the directory's fd
with O_NOFOLLOW, mode 0600 in a 0700 directory; everything read back is checked as hostile.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import zlib

import numpy as np

from ..formats import CODECS
from ..formats.base import FormatError
from ..journals import FINGERPRINT_BYTES, RecordIndex, open_path

log = logging.getLogger("journalfs.fs.indexfiles")

MAGIC = b"JFSIDX1\n"
SUFFIX = ".jfsidx"
DIR_NAME = "indexes"
#: An index file larger than this is not ours (12M records need ~200 KiB).
MAX_INDEX_BYTES = 256 << 20
MAX_HEADER_BYTES = 64 << 10
#: What the index files may take in the store's directory: per journal owner and in all.
#: Past it an index is kept in memory only (it is a cache); files of journals that are gone
#: are removed (when the mount sees them go, and by the sweep at start).
OWNER_INDEX_BYTES = 64 << 20
TOTAL_INDEX_BYTES = 256 << 20


def head_crc(buf) -> int:
    return zlib.crc32(buf[:FINGERPRINT_BYTES])


class IndexDir:
    """The directory of on-disk indexes; ``None``-safe: with no usable directory every load
    misses and every save is skipped (the views then index in memory only)."""

    def __init__(self, store_dir: str | None, owner_bytes: int = OWNER_INDEX_BYTES,
                 total_bytes: int = TOTAL_INDEX_BYTES):
        self.fd = -1
        self.owner_limit, self.total_limit = owner_bytes, total_bytes
        self.files: dict[str, tuple[int, int, str | None]] = {}  # name -> (owner, bytes, rel)
        self.by_owner: dict[int, int] = {}
        self.total = 0
        self.refused = 0
        self._lock = threading.Lock()  # the accounting (saves run in worker threads)
        if not store_dir:
            return
        try:
            self.fd = self._open(store_dir)
        except OSError as exc:
            log.warning("journal indexes are kept in memory only: %s/%s: %s",
                        store_dir, DIR_NAME, exc.strerror or exc)

    @staticmethod
    def _open(store_dir: str) -> int:
        parent = os.open(store_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                os.mkdir(DIR_NAME, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(DIR_NAME, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        finally:
            os.close(parent)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            os.close(fd)
            raise OSError(errno.EPERM, "not a private directory of the mount's user "
                          f"(owner {st.st_uid}, mode {stat.filemode(st.st_mode)})")
        return fd

    @property
    def usable(self) -> bool:
        return self.fd >= 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @staticmethod
    def name_of(dev: int, ino: int) -> str:
        return f"{dev:x}-{ino:x}{SUFFIX}"

    # -- accounting -----------------------------------------------------------------------
    def _account(self, name: str, owner: int, size: int, rel: str | None) -> None:
        with self._lock:
            self._unaccount_locked(name)
            self.files[name] = (owner, size, rel)
            self.by_owner[owner] = self.by_owner.get(owner, 0) + size
            self.total += size

    def _unaccount(self, name: str) -> None:
        with self._lock:
            self._unaccount_locked(name)

    def _unaccount_locked(self, name: str) -> None:
        old = self.files.pop(name, None)
        if old is None:
            return
        owner, size, _ = old
        left = self.by_owner.get(owner, 0) - size
        if left > 0:
            self.by_owner[owner] = left
        else:
            self.by_owner.pop(owner, None)
        self.total -= size

    def scan(self, still_there=None) -> None:
        """Account for the index files present (their headers' owner; -1 when unknown) and
        remove those whose journal ``still_there(rel, dev, ino)`` says is gone."""
        if self.fd < 0:
            return
        dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            names = os.listdir(dfd)  # (self.fd is O_PATH: not listable itself)
        finally:
            os.close(dfd)
        for name in names:
            if not name.endswith(SUFFIX):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                             dir_fd=self.fd)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                head = os.pread(fd, MAX_HEADER_BYTES, 0) if stat.S_ISREG(st.st_mode) else b""
            except OSError:
                continue
            finally:
                os.close(fd)
            owner, rel, dev, ino = -1, None, None, None
            try:
                header = json.loads(head[len(MAGIC):].split(b"\n", 1)[0])
                owner = int(header.get("owner", -1))
                rel = header.get("rel")
                dev, ino = int(header["dev"]), int(header["ino"])
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            if still_there is not None and isinstance(rel, str) and dev is not None \
                    and not still_there(rel, dev, ino):
                self._unlink(name)
                continue
            self._account(name, owner, st.st_size, rel if isinstance(rel, str) else None)

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass
        self._unaccount(name)

    def remove(self, dev: int, ino: int) -> None:
        """The journal (dev, ino) is gone: its index file too."""
        if self.fd >= 0:
            self._unlink(self.name_of(dev, ino))

    def status(self) -> dict:
        return {"files": len(self.files), "bytes": self.total, "owners": len(self.by_owner),
                "owner_limit": self.owner_limit, "total_limit": self.total_limit,
                "refused": self.refused}

    # -- reading --------------------------------------------------------------------------
    def load(self, dev: int, ino: int, path: str) -> tuple[RecordIndex, dict, tuple | None] | None:
        """(index, header, layout) saved for the file (dev, ino), or None. ``layout`` is
        (line seqs, line offsets, size) of its records.jsonl when that was saved. The caller
        decides whether it still holds for the file as it is now (:func:`matches`)."""
        if self.fd < 0:
            return None
        try:
            fd = os.open(self.name_of(dev, ino), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INDEX_BYTES:
                return None
            data = os.pread(fd, st.st_size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return _parse(data, dev, ino, path)
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            log.warning("ignoring a bad journal index file %s: %s", self.name_of(dev, ino), exc)
            return None

    # -- writing --------------------------------------------------------------------------
    def save(self, index: RecordIndex, head: int, layout: tuple | None = None,
             owner: int = -1, rel: str | None = None) -> bool:
        """Write ``index`` (and the records.jsonl ``layout``) for its journal, charged to the
        journal's ``owner``; False when not possible or over the owner's or the total
        budget (reported in the log, never raised: the on-disk index is only a cache)."""
        if self.fd < 0 or not index.identity:
            return False
        ino, size, mtime_ns = index.identity
        seqs = np.asarray(index.seqs[:len(index.offsets)], dtype="<i8")
        offsets = np.asarray(index.offsets[:len(seqs)], dtype="<i8")
        lseqs = np.asarray(layout[0] if layout else (), dtype="<i8")
        loffs = np.asarray(layout[1] if layout else (), dtype="<i8")
        error = None if index.error is None else [int(index.error.offset), str(index.error.reason)]
        header = {
            "codec": index.codec.name, "dev": index.dev, "ino": ino, "size": size,
            "mtime_ns": mtime_ns, "head_crc": head,
            "fingerprint": list(index.fingerprint) if index.fingerprint else None,
            "count": index.count, "error": error, "checkpoints": len(seqs),
            "layout_rows": len(lseqs) if layout else None,
            "layout_size": layout[2] if layout else None,
            "owner": owner, "rel": rel,
        }
        data = b"".join([MAGIC, json.dumps(header).encode() + b"\n", seqs.tobytes(),
                         offsets.tobytes(), lseqs.tobytes(), loffs.tobytes()])
        name = self.name_of(index.dev, ino)
        with self._lock:
            old = self.files.get(name)
            freed = old[1] if old is not None else 0
            freed_owner = freed if old is not None and old[0] == owner else 0
            if self.total - freed + len(data) > self.total_limit or \
                    self.by_owner.get(owner, 0) - freed_owner + len(data) > self.owner_limit:
                self.refused += 1
                return False
        tmp = f".{name}.{os.getpid()}.{id(index):x}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=self.fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            self._account(name, owner, len(data), rel)
            return True
        except OSError as exc:
            log.warning("could not save the index of %s: %s", index.path, exc)
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            return False


def _parse(data: bytes, dev: int, ino: int, path: str):
    if not data.startswith(MAGIC):
        raise ValueError("no index magic")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    if end < 0:
        raise ValueError("no header line")
    header = json.loads(data[len(MAGIC):end])
    if not isinstance(header, dict) or header.get("dev") != dev or header.get("ino") != ino:
        raise ValueError("header names another file")
    codec = CODECS.get(header["codec"])
    if codec is None:
        raise ValueError(f"unknown codec {header['codec']!r}")
    n = int(header["checkpoints"])
    rows = header.get("layout_rows")
    m = 0 if rows is None else int(rows)
    body = memoryview(data)[end + 1:]
    if n < 0 or m < 0 or len(body) != 8 * (2 * n + 2 * m):
        raise ValueError("array sizes do not match the header")
    arrays = np.frombuffer(body, dtype="<i8")
    seqs, offsets = arrays[:n], arrays[n:2 * n]
    count, size = int(header["count"]), int(header["size"])
    if n and (seqs[0] < 0 or np.any(np.diff(seqs) <= 0) or seqs[-1] >= max(count, 1)
              or np.any(offsets < 0) or np.any(offsets > size) or np.any(np.diff(offsets) <= 0)):
        raise ValueError("checkpoints out of order or outside the file")
    index = RecordIndex(path, codec, count=count, seqs=seqs.tolist(), offsets=offsets.tolist(),
                        identity=(ino, size, int(header["mtime_ns"])), dev=dev)
    fp = header.get("fingerprint")
    index.fingerprint = tuple(int(v) for v in fp) if fp else ()
    if header.get("error"):
        offset, reason = header["error"]
        index.error = FormatError(path, int(offset), str(reason))
    layout = None
    if rows is not None:
        lseqs, loffs = arrays[2 * n:2 * n + m], arrays[2 * n + m:]
        lsize = int(header["layout_size"])
        if m and (np.any(np.diff(lseqs) <= 0) or np.any(np.diff(loffs) <= 0)
                  or loffs[0] < 0 or loffs[-1] > lsize):
            raise ValueError("records.jsonl layout out of order")
        layout = (lseqs.tolist(), loffs.tolist(), lsize)
    return index, header, layout


def matches(header: dict, codec: str, size: int, mtime_ns: int, head: int) -> bool:
    """The saved index was taken of exactly this file as it is now."""
    return (header["codec"] == codec and header["size"] == size
            and header["mtime_ns"] == mtime_ns and header["head_crc"] == head)


def may_extend(header: dict, codec: str, size: int, head: int) -> bool:
    """The file may have grown from what the saved index describes (RecordIndex.build checks
    the bytes before its last checkpoint before extending)."""
    return header["codec"] == codec and header["size"] <= size and header["head_crc"] == head


#: Files at least this big keep their record index in the user's cache directory.
SAVE_INDEX_BYTES = 4 << 20


def user_cache_dir() -> str:
    """``$XDG_CACHE_HOME/journalfs`` (``~/.cache/journalfs``): the indexes of the CLI and the
    pipeline, in its ``indexes/``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "journalfs")


class IndexCache:
    """Record indexes of the user's own journals, kept in ``TOP/indexes`` (default: the
    user's cache directory; the CLI's selections and the pipeline's splits share them):
    loaded when they still describe the file (dev, inode, size, mtime, CRC of its head),
    extended when it only grew, else built, and saved when the file is big. ``top`` None
    with ``JOURNALFS_NO_INDEX_CACHE`` set, or "" : in memory only."""

    def __init__(self, top: str | None = None, save_bytes: int = SAVE_INDEX_BYTES):
        if top is None and os.environ.get("JOURNALFS_NO_INDEX_CACHE") is None:
            top = user_cache_dir()
        self.save_bytes = save_bytes
        self._dir = self._open(top) if top else None

    @staticmethod
    def _open(top: str) -> IndexDir | None:
        try:
            os.makedirs(top, mode=0o700, exist_ok=True)
            st = os.stat(top)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                return None  # not private to this user: not trusted with indexes
        except OSError:
            return None
        cache = IndexDir(top)
        return cache if cache.usable else None

    def __call__(self, source) -> RecordIndex:
        """The index of a ``selection.Source`` (its path and codec)."""
        return self.index(source.path, source.codec)

    def index(self, path: str, codec) -> RecordIndex:
        def opener():
            return open_path(path)
        previous = None
        fd = opener()
        try:
            st = os.fstat(fd)
            head = head_crc(os.pread(fd, FINGERPRINT_BYTES, 0))
        finally:
            os.close(fd)
        loaded = self._dir.load(st.st_dev, st.st_ino, path) if self._dir else None
        if loaded is not None:
            index, header, _layout = loaded
            if matches(header, codec.name, st.st_size, st.st_mtime_ns, head):
                index.opener, index.complete = opener, True
                return index
            if may_extend(header, codec.name, st.st_size, head):
                previous = index
        index = RecordIndex.build(path, codec, previous=previous, opener=opener)
        if self._dir is not None and st.st_size >= self.save_bytes:
            self._dir.save(index, head)
        return index

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()
            self._dir = None


__all__ = ["IndexCache", "IndexDir", "head_crc", "matches", "may_extend", "user_cache_dir"]
