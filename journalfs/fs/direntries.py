"""READDIRPLUS replies built as one byte block per batch of entries, for big views.

``pyfuse3.readdir_reply`` adds one entry per Python call (0.6-0.9 µs of daemon CPU per entry
with the name and the attribute object): for a 12M-record view, most of the daemon's time.
Entries listed by name only (``dirlist.NameOnlyEntry``: node id 0) differ from each other in
three numbers and the name, so a batch of them is built with numpy from one template entry
that ``fuse_add_direntry_plus`` itself wrote, and copied into the reply buffer in one go.

The reply buffer belongs to pyfuse3's ``ReaddirToken`` (a C struct behind a Python object:
request, buffer start, write position, room left; pyfuse3 sends ``buffer start .. size -
room`` and frees the buffer with ``free``). Its layout is checked at import by letting
``readdir_reply`` write entries of three records into a probe token and comparing them byte
for byte with what :func:`entries` builds for the same records; if anything differs,
:data:`available` is False and views use ``readdir_reply`` per entry as before (the mount
logs it; tests/test_fs_cstructs.py fails). What it buys: ARCHITECTURE.md, "Writes into
pyfuse3's objects".
"""
from __future__ import annotations

import ctypes
import errno
import sys

import numpy as np
import pyfuse3

from .dirlist import STRUCT_WRITES, NameOnlyEntry

#: Offsets inside a ``fuse_direntplus`` (the kernel ABI, linux/fuse.h): fuse_entry_out
#: (nodeid, generation, entry/attr valid, their nsec, then fuse_attr starting with ino),
#: then fuse_dirent (ino, off, namelen, type, name padded to 8 bytes).
ATTR_INO = 40
DIRENT_INO = 128
DIRENT_OFF = 136
DIRENT_NAMELEN = 144
NAME = 152

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = (ctypes.c_size_t,)
_libc.free.argtypes = (ctypes.c_void_p,)

# ReaddirToken after the object header: fuse_req_t req, char *buf_start, char *buf, size_t size
_HEAD = object.__basicsize__
_BUF_START, _BUF, _SIZE = _HEAD + 8, _HEAD + 16, _HEAD + 24


def _field(token, offset: int) -> ctypes.c_size_t:
    return ctypes.c_size_t.from_address(id(token) + offset)


def room(token) -> int:
    """Bytes still free in ``token``'s reply."""
    return _field(token, _SIZE).value


def append(token, block: np.ndarray) -> None:
    """Copy ``block`` (uint8, contiguous, at most :func:`room` bytes of whole entries) into
    ``token``'s reply, allocating the reply buffer as ``readdir_reply`` would (with malloc:
    only the bytes written are sent, zeroing the rest of a 1 MiB buffer is wasted)."""
    size = _field(token, _SIZE)
    if len(block) > size.value:
        raise ValueError("block larger than the room left in the reply")
    start, pos = _field(token, _BUF_START), _field(token, _BUF)
    if not start.value:
        buf = _libc.malloc(size.value)
        if not buf:
            raise pyfuse3.FUSEError(errno.ENOMEM)
        start.value = pos.value = buf
    ctypes.memmove(pos.value, block.ctypes.data, len(block))
    pos.value += len(block)
    size.value -= len(block)


def template(attrs: pyfuse3.EntryAttributes) -> np.ndarray | None:
    """The first :data:`NAME` bytes of the entry ``readdir_reply`` writes for ``attrs``
    (name, inode number and offset then set per entry), or None if the token's layout or
    the entry's is not the expected one."""
    token = pyfuse3.ReaddirToken()
    if type(token).__basicsize__ != _HEAD + 32:
        return None
    _field(token, _SIZE).value = 4096
    try:
        if not pyfuse3.readdir_reply(token, b"probe.x", attrs, 0x0102030405060708):
            return None
        start = _field(token, _BUF_START).value
        written = 4096 - _field(token, _SIZE).value
        if not start or _field(token, _BUF).value != start + written:
            return None
        entry = np.frombuffer(ctypes.string_at(start, written), np.uint8).copy()
    finally:
        if _field(token, _BUF_START).value:
            _libc.free(_field(token, _BUF_START).value)
        for offset in (_BUF_START, _BUF, _SIZE):
            _field(token, offset).value = 0
    expected = (NAME + 7 + 7) & ~7
    head = entry[:NAME]
    u64, u32 = head.view("<u8"), head.view("<u4")
    if (written != expected or entry[NAME:NAME + 7].tobytes() != b"probe.x"
            or entry[NAME + 7:].any() or u64[DIRENT_OFF // 8] != 0x0102030405060708
            or u32[DIRENT_NAMELEN // 4] != 7 or u64[DIRENT_INO // 8] != u64[ATTR_INO // 8]):
        return None
    return head.copy()


def _probe() -> bool:
    if not NameOnlyEntry.available:
        return False
    plain = NameOnlyEntry(0o100644)
    plain.ino.value = 0x1122334455
    head = template(plain.attrs)
    if head is None:
        return False
    # the same three entries by readdir_reply and by entries(): byte for byte
    names = [b"00000007.a", b"00000008.kind", b"00000009.x"]
    token = pyfuse3.ReaddirToken()
    _field(token, _SIZE).value = 4096
    try:
        for seq, name in enumerate(names, 7):
            plain.ino.value = 0x1122334455 | seq
            if not pyfuse3.readdir_reply(token, name, plain.attrs, seq + 2):
                return False
        start = _field(token, _BUF_START).value
        by_pyfuse3 = ctypes.string_at(start, 4096 - _field(token, _SIZE).value)
    finally:
        if _field(token, _BUF_START).value:
            _libc.free(_field(token, _BUF_START).value)
        for offset in (_BUF_START, _BUF, _SIZE):
            _field(token, offset).value = 0
    block, ends = entries(head, 7, [(1, b"a"), (2, [b"kind", b"x"])], 0x1122334455, 2)
    return block.tobytes() == by_pyfuse3 and int(ends[-1]) == len(by_pyfuse3)


#: Record numbers below this have exactly 8 digits in their names (``%08d``).
EIGHT_DIGITS = 10 ** 8
#: "0000" .. "9999" as little-endian 4-byte words: two lookups write a record's 8 digits.
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % v for v in range(10_000)), "<u4")


def entries(head: np.ndarray, first: int, kinds: list[tuple[int, bytes | list[bytes]]],
            ino_base: int, off_base: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries for records ``first``, ``first + 1``, ... named ``<seq as 8 digits>.<kind>``:
    ``kinds`` gives their kinds as runs of (count, one kind for all of them, or a list of
    one kind each). Entry ``i`` shows inode ``ino_base | (first + i)`` and carries the
    cursor ``first + i + off_base``. Returns the entries as one uint8 block and where each
    one ends in it. Records from 10**8 on (9 digits and more) are not handled here."""
    table: dict[bytes, int] = {}
    parts = []
    for count, kind in kinds:
        if isinstance(kind, bytes):
            parts.append(np.full(count, table.setdefault(kind, len(table)), np.int64))
        else:
            parts.append(np.fromiter(map(lambda k: table.setdefault(k, len(table)), kind),
                                     np.int64, count))
    n = sum(map(len, parts))
    if first + n > EIGHT_DIGITS:
        raise ValueError("record numbers of more than 8 digits")
    codes = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    kind_names = list(table)
    kind_lens = np.array([len(k) for k in kind_names], np.int64)
    sizes = (NAME + 9 + kind_lens + 7) & ~7
    entry_sizes = sizes[codes] if n else codes
    ends = np.cumsum(entry_sizes)
    # every byte is written below (head, name, zero padding): no zeroing first
    block = np.empty(int(ends[-1]) if n else 0, np.uint8)
    if not n:
        return block, ends
    seqs = np.arange(first, first + n, dtype=np.int64)
    starts = ends - entry_sizes
    for code, kind in enumerate(kind_names):
        size = int(sizes[code])
        if len(kind_names) == 1:  # one kind: the block is a matrix of equal entries
            which, some, rows = None, seqs, block.reshape(n, size)
        else:
            which = np.flatnonzero(codes == code)
            some, rows = seqs[which], np.empty((len(which), size), np.uint8)
        rows[:, :NAME] = head
        digits = rows[:, NAME:NAME + 8].view("<u4")
        digits[:, 0] = _DIGITS4[some // 10_000]
        digits[:, 1] = _DIGITS4[some % 10_000]
        rows[:, NAME + 8] = ord(".")
        rows[:, NAME + 9:NAME + 9 + len(kind)] = np.frombuffer(kind, np.uint8)
        rows[:, NAME + 9 + len(kind):] = 0
        words = rows.view("<u8")
        words[:, ATTR_INO // 8] = words[:, DIRENT_INO // 8] = some | ino_base
        words[:, DIRENT_OFF // 8] = some + off_base
        rows.view("<u4")[:, DIRENT_NAMELEN // 4] = 9 + len(kind)
        if which is not None:  # scatter whole 8-byte words to where these entries start
            at = (starts[which] // 8)[:, None] + np.arange(size // 8)
            block.view("<u8")[at.ravel()] = words.ravel()
    return block, ends


available = STRUCT_WRITES == "all" and sys.byteorder == "little" and _probe()
