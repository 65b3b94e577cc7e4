"""Names as log lines and status.json may show them: the one escaping helper.

A file name is bytes chosen by whoever made the file: it can hold a newline (a forged log
line), ESC (terminal control sequences), bytes that are not UTF-8. ``escaped`` writes them as
systemd does (``cescape``, what journalctl shows): ``\\n``, ``\\t``, ``\\\\`` ..., other
control bytes and bytes that are not UTF-8 as ``\\xNN``; Unicode line separators, C1 controls
and bidi overrides as ``\\uNNNN``. Every log line passes through :class:`EscapingFormatter`,
so no name reaches a log unescaped whichever code logged it.
"""
from __future__ import annotations

import logging
import re
import traceback

_NAMED = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
          "\v": "\\v", "\\": "\\\\"}
# C0 and C1 controls, DEL, backslash, surrogates (bytes that were not UTF-8, decoded with
# surrogateescape), line/paragraph separators and bidi embeddings/overrides/isolates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\\\\\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")


def _escape_char(match: re.Match) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def escaped(name: str | bytes) -> str:
    """``name`` (bytes, or str decoded with surrogateescape) as one printable line."""
    if isinstance(name, (bytes, bytearray, memoryview)):
        name = bytes(name).decode("utf-8", "surrogateescape")
    if name.isascii() and name.isprintable() and "\\" not in name:
        return name  # the common case, no regex
    return _UNSAFE.sub(_escape_char, name)


class EscapingFormatter(logging.Formatter):
    """A log formatter whose lines carry no raw control bytes: the message is escaped as a
    whole (whatever a caller interpolated into it), and so is the text of an exception
    (its frames come from our own source and stay as they are)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        parts = []
        for chunk in traceback.TracebackException(*ei).format():
            if chunk.startswith("  File "):
                parts.append(chunk)
            else:
                body = chunk[:-1] if chunk.endswith("\n") else chunk
                parts.append(escaped(body) + "\n")
        return "".join(parts).rstrip("\n")
