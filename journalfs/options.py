"""Choices the command line offers whose meaning lives in the code below it.

They are defined here, in a module that imports nothing, so that parsing a command line (and
``--help`` and the man page) loads none of the modules that implement them; those import the
names from here.
"""

#: How ``--payload`` shows a record's payload: ``base64`` is the contract's ``payload_b64``
#: (the default of JSON lines); ``text`` and ``auto`` give UTF-8 payloads as ``payload`` text
#: (anything else stays ``payload_b64``); ``hex`` gives ``payload_hex``.
PAYLOAD_MODES = ("auto", "text", "hex", "base64")

#: Mount options' defaults. Seconds the kernel may cache names and attributes (-o timeout=). Long, because journalfs
#: invalidates precisely whatever it changes itself; only changes made directly in SOURCE
#: behind the mount wait for the timeout to become visible.
DEFAULT_TIMEOUT = 120.0
#: KiB the kernel reads ahead on the mount (-o readahead=, 0 keeps the kernel's 128). Journals
#: are read front to back: 1 MiB readahead means 8x fewer READ requests, each a worker-thread
#: round trip, than the kernel's default.
DEFAULT_READAHEAD_KIB = 1024

#: The kernel's writeback cache (-o writeback_cache, -o no_writeback_cache): writes gather in
#: the mount's page cache and reach the daemon in large requests at writeback, close or
#: fsync; the kernel then owns the size and mtime of regular files (README, "FUSE").
DEFAULT_WRITEBACK_CACHE = False

#: --sync of a metadata store: the one definition (see metastore.store.MetaStore).
SYNC_MODES = ("always", "batch", "none")

#: The metadata quota (metastore/ledger.py, docs/security.md): mount options
#: (``-o quota_user=32M``) and runtime settings (``user.journalfs.quota_user``) of the same
#: names, with their defaults in bytes: one file's metadata (one ext4 xattr block), one
#: uid's, everyone's.
QUOTA_DEFAULTS = {"quota_file": 4096, "quota_user": 16 << 20, "quota_total": 64 << 20}
#: The largest quota accepted (1 TiB): the store is not meant to hold more.
QUOTA_MAX = 1 << 40
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a quota: a whole number, optionally with K, M, G or T (binary: 1K = 1024);
    ValueError saying what is accepted."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _SIZE_UNITS else ""
    number = value[:len(value) - len(unit)]
    if not number.isdigit() or int(number) * _SIZE_UNITS[unit] > QUOTA_MAX:
        raise ValueError(f"a quota is a number of bytes up to 1T, optionally with K, M, G or "
                         f"T (1K = 1024), not {text!r}")
    return int(number) * _SIZE_UNITS[unit]

#: The Spark driver's heap when ``pipeline --driver-memory`` is not given: what the work needs is
#: flat in the input's size (a 1 GB journal runs in 1g), this leaves room for many cores' tasks
#: at once.
DEFAULT_DRIVER_GIB = 2
