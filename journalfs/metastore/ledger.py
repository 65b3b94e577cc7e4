"""Who owns each path's metadata, and how much of the store each user holds: the ledger
beside a store (``<tree>.journalfs-ledger``), written only by the store's writer.

The gvfs tree and journal key metadata by path, and gvfs readers must keep reading them as
they are. Native xattrs belong to the *file*, though: a new file at an old path starts bare,
a renamed file keeps its attributes. The ledger ties each store path that holds metadata
written through a mount to the identity of the file it was written for -- ``(st_ino, birth
time in ns)`` from ``statx(STATX_BTIME)``: an inode number is reused at once on ext4, a
number plus its birth time is not -- and to the uid charged for it (the file's owner, as
ext4 charges an xattr block to the inode's owner) and its size in bytes.

The ledger is an append-only file of CRC'd records (one PUT or DEL per path), replayed at
open, rewritten compactly when mostly dead. It is hostile input like every store file: a
record that is cut short or fails its CRC ends the replay (everything before it is kept) and
the writer truncates the file there. Its size is bounded by the quota (one record per path
with metadata) times the compaction factor.

Quota (see docs/security.md): ``per_file`` bytes per path (ext4: one 4 KiB xattr block per
inode), ``per_user`` bytes per uid and ``total`` bytes over all uids. A path costs
PATH_OVERHEAD plus, per value, ``len(key) + len(value) + ENTRY_OVERHEAD`` (an element of a
list value: its bytes + 1).
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import zlib

from sortedcontainers import SortedList

from ..options import QUOTA_DEFAULTS

LEDGER_SUFFIX = ".journalfs-ledger"
_MAGIC = b"JFSLEDG1"
_HEAD = struct.Struct(">II")          # body length, crc32 of the body
_PUT = struct.Struct(">QqIQ")         # ino, birth time ns, uid, bytes
_OP_PUT, _OP_DEL = 1, 2
MAX_RECORD = 1 << 16
#: Per metadata value: its key and journal/tree framing, as an ext4 xattr entry costs ~20.
ENTRY_OVERHEAD = 32
#: Per path holding metadata: its tree node and what the ledger and the mount keep for it
#: in memory -- so that the quota bounds the daemon's memory too, not only the disk.
PATH_OVERHEAD = 256
PER_FILE_DEFAULT = QUOTA_DEFAULTS["quota_file"]
PER_USER_DEFAULT = QUOTA_DEFAULTS["quota_user"]
TOTAL_DEFAULT = QUOTA_DEFAULTS["quota_total"]
#: The quota's settings (options.QUOTA_DEFAULTS) -> the Ledger attribute each one sets.
QUOTA_ATTRIBUTES = {"quota_file": "per_file", "quota_user": "per_user",
                    "quota_total": "total_limit"}

Identity = tuple  # (st_ino, birth time ns); birth time 0 where the filesystem has none


class QuotaExceeded(OSError):
    pass


def _utf8_len(text: str) -> int:
    """Bytes of ``text`` as stored (an ASCII str: its length, nothing encoded)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


def _value_bytes(key: str, value) -> int:
    """What one key and its value cost (see the module doc)."""
    total = _utf8_len(key) + ENTRY_OVERHEAD
    if isinstance(value, (list, tuple)):
        return total + sum(_utf8_len(str(v)) + 1 for v in value)
    return total + _utf8_len(str(value))


def metadata_bytes(values: dict) -> int:
    """What the quota charges for one path's values (0: none)."""
    if not values:
        return 0
    return PATH_OVERHEAD + sum(_value_bytes(k, v) for k, v in values.items())


def metadata_bytes_with(values: dict, key: str, value) -> int:
    """:func:`metadata_bytes` of ``values`` once ``key`` is set to ``value`` (no copy)."""
    total = PATH_OVERHEAD + _value_bytes(key, value)
    for k, v in values.items():
        if k != key:
            total += _value_bytes(k, v)
    return total


# -- statx ------------------------------------------------------------------------------------
class _StatxTs(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_r", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    _fields_ = [("stx_mask", ctypes.c_uint32), ("stx_blksize", ctypes.c_uint32),
                ("stx_attributes", ctypes.c_uint64), ("stx_nlink", ctypes.c_uint32),
                ("stx_uid", ctypes.c_uint32), ("stx_gid", ctypes.c_uint32),
                ("stx_mode", ctypes.c_uint16), ("_s0", ctypes.c_uint16),
                ("stx_ino", ctypes.c_uint64), ("stx_size", ctypes.c_uint64),
                ("stx_blocks", ctypes.c_uint64), ("stx_attributes_mask", ctypes.c_uint64),
                ("stx_atime", _StatxTs), ("stx_btime", _StatxTs), ("stx_ctime", _StatxTs),
                ("stx_mtime", _StatxTs), ("_rest", ctypes.c_uint64 * 32)]


assert ctypes.sizeof(_Statx) >= 256  # the kernel writes all 256 bytes of struct statx


_libc = ctypes.CDLL(None, use_errno=True)
_STATX_INO, _STATX_BTIME, _STATX_UID = 0x100, 0x800, 0x8
_AT_EMPTY_PATH, _AT_SYMLINK_NOFOLLOW = 0x1000, 0x100


def file_identity(fd: int, name: bytes = b"") -> tuple[Identity, int]:
    """((st_ino, birth ns), st_uid) of the object ``name`` in directory ``fd`` (``name``
    empty: ``fd`` itself, an O_PATH fd is fine); never follows a final symlink."""
    buf = _Statx()
    flags = _AT_SYMLINK_NOFOLLOW | (_AT_EMPTY_PATH if not name else 0)
    if _libc.statx(fd, name, flags, _STATX_INO | _STATX_BTIME | _STATX_UID,
                   ctypes.byref(buf)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    btime = 0
    if buf.stx_mask & _STATX_BTIME:
        btime = buf.stx_btime.tv_sec * 1_000_000_000 + buf.stx_btime.tv_nsec
    return (buf.stx_ino, btime), buf.stx_uid


# -- the ledger --------------------------------------------------------------------------------
def _encode(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def _record(op: int, body: bytes) -> bytes:
    body = bytes((op,)) + body
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


class Ledger:
    """Path -> (identity, uid, bytes) of metadata written through the mount; per-uid and
    total bytes. Thread-safe; the writer's only (``StoreDir`` opens, no symlinks)."""

    def __init__(self, store_dir, tree_name: str, *, per_file: int = PER_FILE_DEFAULT,
                 per_user: int = PER_USER_DEFAULT, total: int = TOTAL_DEFAULT):
        self._dir = store_dir
        self.name = tree_name + LEDGER_SUFFIX
        self.per_file, self.per_user, self.total_limit = per_file, per_user, total
        self._lock = threading.Lock()
        self.entries: dict[str, tuple[Identity, int, int]] = {}
        self._paths = SortedList()
        self.by_identity: dict[Identity, set[str]] = {}
        self.by_uid: dict[int, int] = {}
        self.total = 0
        self.damage: str | None = None
        self._fd = -1
        self._size = 0
        self._dirty = False
        #: what the mount's pass for files that are gone did (fs/ownership.py expire_gone)
        self.expiry = {"state": "not started", "checked": 0, "expired": 0, "bytes": 0}
        self._open()

    # -- file --------------------------------------------------------------------------------
    def _open(self) -> None:
        """Load the ledger if there is one; it is created by its first record (a store no
        mount wrote through keeps gvfs's files only)."""
        try:
            fd, st = self._dir.open_file(self.name, os.O_RDWR)
        except FileNotFoundError:
            return
        self._fd = fd
        data = os.pread(fd, st.st_size, 0) if st.st_size else b""
        if not data:
            os.pwrite(fd, _MAGIC, 0)
            self._size = len(_MAGIC)
            return
        if not data.startswith(_MAGIC):
            self.damage = f"{self._dir.where(self.name)}: not a journalfs ledger (bad magic)"
            self._rewrite()
            return
        pos = len(_MAGIC)
        while pos < len(data):
            if pos + _HEAD.size > len(data):
                self.damage = f"{self._dir.where(self.name)}: cut short at byte {pos}"
                break
            length, crc = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size:pos + _HEAD.size + length]
            if not 1 <= length <= MAX_RECORD or len(body) != length or zlib.crc32(body) != crc:
                self.damage = f"{self._dir.where(self.name)}: damaged record at byte {pos}"
                break
            try:
                self._replay(body)
            except (struct.error, UnicodeError, ValueError):
                self.damage = f"{self._dir.where(self.name)}: bad record at byte {pos}"
                break
            pos += _HEAD.size + length
        self._size = pos
        if pos < len(data):
            os.ftruncate(fd, pos)  # drop the damaged tail: appends go after the valid prefix

    def _replay(self, body: bytes) -> None:
        op = body[0]
        if op == _OP_PUT:
            ino, btime, uid, size = _PUT.unpack_from(body, 1)
            self._put((ino, btime), uid, size, body[1 + _PUT.size:].decode("utf-8", "surrogateescape"))
        elif op == _OP_DEL:
            self._del(body[1:].decode("utf-8", "surrogateescape"))
        else:
            raise ValueError(op)

    def _append(self, records: list[bytes]) -> None:
        if not records:
            return
        if self._fd < 0:
            fd, _ = self._dir.open_file(self.name, os.O_RDWR | os.O_CREAT)
            self._fd = fd
            if os.pwrite(fd, _MAGIC, 0) != len(_MAGIC):
                raise OSError(errno.ENOSPC, f"{self._dir.where(self.name)}: short write")
            self._size = len(_MAGIC)
        data = b"".join(records)
        written = os.pwrite(self._fd, data, self._size)
        if written != len(data):
            os.ftruncate(self._fd, self._size)
            raise OSError(errno.ENOSPC, f"{self._dir.where(self.name)}: short write")
        self._size += written
        self._dirty = True
        live = len(self.entries) * 64 + (1 << 20)
        if self._size > 4 * live:
            try:
                self._rewrite()
            except OSError:  # a full or read-only store directory: appends still work
                pass

    def _rewrite(self) -> None:
        """The live entries into a fresh file renamed over the ledger (fsynced first)."""
        tmp = self.name + ".new"
        self._dir.unlink(tmp)  # a leftover of a rewrite cut short
        fd = self._dir.create_new(tmp)
        try:
            image = [_MAGIC] + [self._put_record(p, *v) for p, v in self.entries.items()]
            data = b"".join(image)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(fd)
            self._dir.rename(tmp, self.name)
        except BaseException:
            os.close(fd)
            self._dir.unlink(tmp)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._size, self._dirty = fd, len(data), False

    @staticmethod
    def _put_record(path: str, ident: Identity, uid: int, size: int) -> bytes:
        return _record(_OP_PUT, _PUT.pack(ident[0], ident[1], uid, size) + _encode(path))

    def flush(self) -> None:
        """fdatasync what was appended so far, on a dup of the fd outside the lock: the
        mount's writes (check, record) never wait for the disk."""
        with self._lock:
            if not self._dirty or self._fd < 0:
                return
            self._dirty = False  # appends from now on mark it again
            fd = os.dup(self._fd)
        try:
            os.fdatasync(fd)
        except BaseException:
            self._dirty = True
            raise
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                if self._dirty:
                    try:
                        os.fdatasync(self._fd)
                    except OSError:
                        pass
                os.close(self._fd)
                self._fd = -1

    # -- memory ------------------------------------------------------------------------------
    def _put(self, ident: Identity, uid: int, size: int, path: str) -> None:
        self._del(path)
        self.entries[path] = (ident, uid, size)
        self._paths.add(path)
        self.by_identity.setdefault(ident, set()).add(path)
        self.by_uid[uid] = self.by_uid.get(uid, 0) + size
        self.total += size

    def _del(self, path: str) -> None:
        old = self.entries.pop(path, None)
        if old is None:
            return
        ident, uid, size = old
        self._paths.remove(path)
        paths = self.by_identity.get(ident)
        if paths is not None:
            paths.discard(path)
            if not paths:
                del self.by_identity[ident]
        left = self.by_uid.get(uid, 0) - size
        if left > 0:
            self.by_uid[uid] = left
        else:
            self.by_uid.pop(uid, None)
        self.total -= size

    def _below(self, path: str) -> list[str]:
        """``path`` and every recorded path under it."""
        if path == "/":
            return list(self._paths)
        out = [path] if path in self.entries else []
        out += list(self._paths.irange(path + "/", path + "0", inclusive=(True, False)))
        return out

    # -- quota settings ----------------------------------------------------------------------
    def quota(self) -> dict[str, int]:
        """The quota's settings (``quota_file``, ``quota_user``, ``quota_total``) in bytes."""
        return {name: getattr(self, attr) for name, attr in QUOTA_ATTRIBUTES.items()}

    def set_quota(self, name: str, size: int) -> None:
        """Change one limit (mount option or runtime setting). A lower limit refuses growth
        from now on; metadata already held stays (removals and shrinking still work)."""
        with self._lock:
            setattr(self, QUOTA_ATTRIBUTES[name], int(size))

    # -- queries -----------------------------------------------------------------------------
    def owner(self, path: str) -> tuple[Identity, int, int] | None:
        return self.entries.get(path)

    def paths_below(self, path: str) -> list[str]:
        """``path`` (if recorded) and every recorded path under it."""
        with self._lock:
            return self._below(path)

    def paths_of(self, ident: Identity) -> list[str]:
        return sorted(self.by_identity.get(ident, ()))

    def usage(self, uid: int) -> int:
        return self.by_uid.get(uid, 0)

    def sample(self, limit: int, start: float) -> list[tuple[str, Identity, int]]:
        """Up to ``limit`` entries (path, identity, uid) in path order, starting at the
        fraction ``start`` (0..1) of the paths and wrapping around: a bounded pass that a
        random ``start`` moves over all entries across calls."""
        with self._lock:
            count = len(self._paths)
            if not count:
                return []
            first = min(int(start * count), count - 1)
            out = []
            for n in range(min(limit, count)):
                path = self._paths[(first + n) % count]
                ident, uid, _ = self.entries[path]
                out.append((path, ident, uid))
            return out

    def check(self, path: str, uid: int, new_size: int) -> None:
        """Raise ENOSPC (the path's values over ``per_file``, as ext4 when an inode's xattr
        block is full) or EDQUOT (the uid's or everyone's total over its limit) if ``path``
        growing to ``new_size`` bytes, charged to ``uid``, is not allowed. Shrinking always is."""
        with self._lock:
            old = self.entries.get(path)
            old_size = old[2] if old is not None and old[1] == uid else 0
            if new_size <= old_size:
                return
            grow = new_size - old_size
            if new_size > self.per_file:
                raise QuotaExceeded(errno.ENOSPC, f"metadata of one file is limited to "
                                    f"{self.per_file} bytes")
            if self.by_uid.get(uid, 0) + grow > self.per_user:
                raise QuotaExceeded(errno.EDQUOT, f"uid {uid}: metadata quota of "
                                    f"{self.per_user} bytes reached")
            if self.total + grow > self.total_limit:
                raise QuotaExceeded(errno.EDQUOT, f"the store's metadata quota of "
                                    f"{self.total_limit} bytes is reached")

    # -- changes (each one append) --------------------------------------------------------------
    def record(self, path: str, ident: Identity, uid: int, size: int) -> None:
        """``path`` now holds ``size`` bytes of metadata of the file ``ident``, charged to
        ``uid`` (size 0: it holds none: forgotten)."""
        with self._lock:
            if size <= 0:
                if path in self.entries:
                    self._del(path)
                    self._append([_record(_OP_DEL, _encode(path))])
                return
            if self.entries.get(path) == (ident, uid, size):
                return
            self._put(ident, uid, size, path)
            self._append([self._put_record(path, ident, uid, size)])

    def removed(self, path: str) -> None:
        """``path`` and everything below it hold nothing any more."""
        with self._lock:
            gone = self._below(path)
            for p in gone:
                self._del(p)
            self._append([_record(_OP_DEL, _encode(p)) for p in gone])

    def moved(self, src: str, dst: str, *, copy: bool = False) -> None:
        """The store moved (or copied) ``src`` and its subtree to ``dst``: what was at
        ``dst`` is gone, the entries follow."""
        with self._lock:
            if src == dst:
                return
            moving = [(p, self.entries[p]) for p in self._below(src)]
            records = []
            for p in self._below(dst):
                self._del(p)
                records.append(_record(_OP_DEL, _encode(p)))
            for p, (ident, uid, size) in moving:
                new = dst + p[len(src):] if src != "/" else dst.rstrip("/") + p
                if not copy:
                    self._del(p)
                    records.append(_record(_OP_DEL, _encode(p)))
                self._put(ident, uid, size, new)
                records.append(self._put_record(new, ident, uid, size))
            self._append(records)

    def status(self) -> dict:
        with self._lock:
            return {"paths": len(self.entries), "bytes": self.total, "users": len(self.by_uid),
                    "per_file": self.per_file, "per_user": self.per_user,
                    "total_limit": self.total_limit, "file_bytes": self._size,
                    "damage": self.damage, "expiry": dict(self.expiry)}
