"""The fast paths that write into pyfuse3's objects by address (fs/dirlist.py's
NameOnlyEntry: the node id of an EntryAttributes; fs/direntries.py: a ReaddirToken's reply
buffer) are guarded by probes at import, which turn them off when pyfuse3's layout is not
the one they were written for. The mount then still works (slower listings, a warning in
its log), but the suite must not pass quietly: a pyfuse3 upgrade that moves a field fails
here, by name, until the offsets are checked again or the fast paths dropped."""
from __future__ import annotations

import ctypes
import stat
import sys

import pyfuse3
import pytest

from journalfs.fs import direntries
from journalfs.fs.dirlist import STRUCT_WRITES, NameOnlyEntry, _node_id_offsets

pytestmark = pytest.mark.fast


def test_the_probes_match_this_pyfuse3():
    assert STRUCT_WRITES == "all", \
        f"JOURNALFS_STRUCT_WRITES={STRUCT_WRITES!r} is set: the fast paths are not tested"
    assert _node_id_offsets() is not None and NameOnlyEntry.available, \
        f"pyfuse3 {pyfuse3.__version__}: EntryAttributes no longer has the layout " \
        "fs/dirlist.py writes the node id into (NameOnlyEntry is off)"
    assert direntries.available, \
        f"pyfuse3 {pyfuse3.__version__}: ReaddirToken or the entry readdir_reply writes " \
        "changed (fs/direntries.py's reply blocks are off)"


def test_a_name_only_entry_sends_node_id_zero_and_its_inode_number():
    """What the probe promises, seen in the object's memory: st_ino's setter writes both
    the node id and the inode number; NameOnlyEntry zeroes the node id and sets the
    inode number alone."""
    entry = NameOnlyEntry(stat.S_IFREG | 0o444)
    entry.ino.value = 0x0123456789
    raw = ctypes.string_at(id(entry.attrs), sys.getsizeof(entry.attrs))
    needle = (0x0123456789).to_bytes(8, sys.byteorder)
    assert raw.count(needle) == 1  # the inode number, and no node id
    assert entry.attrs.st_mode == stat.S_IFREG | 0o444
    node_at, ino_at = _node_id_offsets()
    assert raw[node_at:node_at + 8] == bytes(8) and raw[ino_at:ino_at + 8] == needle


def test_a_reply_block_is_what_readdir_reply_writes():
    """direntries.append into a token, read back: the same bytes readdir_reply writes."""
    plain = NameOnlyEntry(stat.S_IFREG | 0o444)
    head = direntries.template(plain.attrs)
    block, ends = direntries.entries(head, 5, [(3, b"kind")], 1 << 62, 2)
    token = pyfuse3.ReaddirToken()
    size = direntries._field(token, direntries._SIZE)
    size.value = 4096
    try:
        direntries.append(token, block)
        assert direntries.room(token) == 4096 - len(block)
        start = direntries._field(token, direntries._BUF_START).value
        written = ctypes.string_at(start, len(block))
    finally:
        direntries._libc.free(direntries._field(token, direntries._BUF_START).value)
        for offset in (direntries._BUF_START, direntries._BUF, direntries._SIZE):
            direntries._field(token, offset).value = 0
    assert written == block.tobytes()
    assert b"00000005.kind" in written and b"00000007.kind" in written
    assert int(ends[-1]) == len(block)
