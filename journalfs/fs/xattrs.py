"""How store metadata values look as extended attribute bytes (CONTRACT "The mount").

Keys and values are bytes natively (gvfs keeps C strings: anything without a NUL). Inside
Python they are ``str`` decoded with ``surrogateescape``, so every byte string round-trips."""
from __future__ import annotations

import errno

import pyfuse3

METADATA_PREFIX = b"user.metadata."
#: Linux's XATTR_SIZE_MAX: no native filesystem takes or returns a bigger value.
XATTR_SIZE_MAX = 65536


_KEYS: dict[bytes, str] = {}  # attribute name -> store key, for names seen recently
_KEYS_KEPT = 4096


def known_metadata_key(name: bytes) -> str | None:
    """:func:`metadata_key` for a name seen recently (one dict lookup), else None."""
    return _KEYS.get(name)


def metadata_key(name: bytes) -> str | None:
    """The store key behind ``user.metadata.<key>``, None for any other attribute name."""
    key = _KEYS.get(name)
    if key is not None:
        return key
    if not name.startswith(METADATA_PREFIX):
        return None
    raw = name[len(METADATA_PREFIX):]
    if not raw:
        raise pyfuse3.FUSEError(errno.EINVAL)
    key = raw.decode("utf-8", "surrogateescape")
    if len(_KEYS) >= _KEYS_KEPT:
        _KEYS.clear()
    _KEYS[bytes(name)] = key
    return key


def encode_value(value: str | list[str]) -> bytes:
    """A string is its UTF-8 bytes; a list is each element followed by one NUL."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return b"".join(item.encode("utf-8", "surrogateescape") + b"\0" for item in value)


def decode_value(raw: bytes) -> str | list[str]:
    """Inverse of :func:`encode_value`: any NUL makes a list; a trailing NUL ends the last item."""
    if len(raw) > XATTR_SIZE_MAX:
        raise pyfuse3.FUSEError(errno.E2BIG)
    text = bytes(raw).decode("utf-8", "surrogateescape")
    if "\0" not in text:
        return text
    if text.endswith("\0"):
        text = text[:-1]
    return text.split("\0")


_NAMES: dict[str, bytes] = {}  # store key -> attribute name, for keys listed recently


def metadata_names(keys) -> list[bytes]:
    """The attribute names of store keys (getfattr -R lists every file's: names of keys
    seen before are one dict lookup each)."""
    names = []
    for k in keys:
        name = _NAMES.get(k)
        if name is None:
            if len(_NAMES) >= _KEYS_KEPT:
                _NAMES.clear()
            name = _NAMES[k] = METADATA_PREFIX + k.encode("utf-8", "surrogateescape")
        names.append(name)
    return names
