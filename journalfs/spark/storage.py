"""Where the data source and the pipeline find journals: local paths and ``file://`` URIs
(mapped, as everywhere else), and ``s3://`` / ``s3a://`` objects through ``pyarrow.fs``.

Objects are listed with one request per prefix page, sniffed with a ranged read of their first
bytes, and read by executors with ranged reads into an unlinked sparse file as long as the
object (the bytes a slice needs; zeros elsewhere), mapped and decoded as a local file. The driver never reads a whole object: objects of variable-width formats are not split
(one task each), fixed-width ones are split by arithmetic.

Endpoint and region: the data source options ``endpoint`` (``http://127.0.0.1:9000``) and
``region``, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and ``AWS_REGION`` /
``AWS_DEFAULT_REGION``; credentials come from the AWS SDK's standard chain (environment,
``~/.aws/credentials`` and ``config``, instance roles) on each process that reads.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import tempfile

from pyarrow import fs

from ..journals import mapped_fd

#: URI schemes read as S3 objects (``s3a`` is Hadoop's name for the same thing).
S3_SCHEMES = ("s3", "s3a")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(/.*)?$")
#: Bytes a ranged read asks for at a time (one request each).
READ_CHUNK = 16 << 20


def is_remote(location: str) -> bool:
    m = _URI.match(location)
    return bool(m) and m.group(1).lower() in S3_SCHEMES


def split_s3(location: str) -> tuple[str, str, str]:
    """(scheme, bucket, key without leading or trailing "/") of an ``s3://`` URI."""
    m = _URI.match(location)
    if not m or m.group(1).lower() not in S3_SCHEMES or not m.group(2):
        raise ValueError(f"{location}: not an S3 URI (s3://BUCKET/KEY)")
    return m.group(1), m.group(2), (m.group(3) or "").strip("/")


def s3_options(options: dict | None = None) -> tuple[tuple[str, str], ...]:
    """The endpoint and region to use (hashable, picklable): options first, then the
    standard AWS variables of this process."""
    options = {k.lower(): v for k, v in (options or {}).items() if v}
    endpoint = options.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") \
        or os.environ.get("AWS_ENDPOINT_URL")
    region = options.get("region") or os.environ.get("AWS_REGION") \
        or os.environ.get("AWS_DEFAULT_REGION")
    return tuple((k, v) for k, v in (("endpoint", endpoint), ("region", region)) if v)


@functools.lru_cache(maxsize=8)
def s3_filesystem(settings: tuple[tuple[str, str], ...] = ()):
    """A pyarrow S3 file system for :func:`s3_options`' settings (one per process and
    settings: it holds the connection pool)."""
    settings = dict(settings)
    kwargs = {}
    endpoint = settings.get("endpoint")
    if endpoint:
        m = re.match(r"^(https?)://(.+?)/?$", endpoint)
        if m:
            kwargs["scheme"], kwargs["endpoint_override"] = m.group(1), m.group(2)
        else:
            kwargs["endpoint_override"] = endpoint
    if settings.get("region"):
        kwargs["region"] = settings["region"]
    return fs.S3FileSystem(**kwargs)


def _fs_path(location: str) -> str:
    _scheme, bucket, key = split_s3(location)
    return f"{bucket}/{key}" if key else bucket


def list_objects(location: str, recursive: bool, settings) -> list[tuple[str, int]]:
    """(URI, size) of every object at or under ``location``, sorted; FileNotFoundError when
    there is none."""
    scheme, bucket, key = split_s3(location)
    s3 = s3_filesystem(settings)
    path = _fs_path(location)
    info = s3.get_file_info(path)
    if info.type == fs.FileType.File:
        return [(location, info.size)]
    if info.type == fs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, f"{location}: no such object or prefix")
    selector = fs.FileSelector(path, recursive=recursive)
    out = [(f"{scheme}://{i.path}", i.size) for i in s3.get_file_info(selector)
           if i.type == fs.FileType.File]
    return sorted(out)


def read_head(location: str, nbytes: int, settings) -> bytes:
    """The first ``nbytes`` of an object (one ranged read)."""
    with s3_filesystem(settings).open_input_file(_fs_path(location)) as f:
        return f.read_at(min(nbytes, f.size()), 0) if f.size() else b""


@contextlib.contextmanager
def object_mapped(location: str, ranges: list[tuple[int, int]], settings):
    """A read-only mapping as long as the object holding its bytes in ``ranges`` ([lo, hi)
    pairs) and zeros elsewhere: ranged reads written into an unlinked sparse file in
    ``$TMPDIR``, then mapped, so that the readers treat it as a local file: the pages they
    pass are dropped from the process and fault back in from that file (a worker's memory
    stays as flat as for a local journal; the disk holds the ranges read)."""
    fd = _unlinked_file()
    try:
        with s3_filesystem(settings).open_input_file(_fs_path(location)) as f:
            size = f.size()
            os.ftruncate(fd, size)
            for lo, hi in _merged(ranges, size):
                pos = lo
                while pos < hi:
                    chunk = f.read_at(min(READ_CHUNK, hi - pos), pos)
                    if not chunk:  # shorter than listed: the rest stays zeros
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.pwrite(fd, view, pos + len(chunk) - len(view)):]
                    pos += len(chunk)
        with mapped_fd(fd) as buf:
            yield buf
    finally:
        os.close(fd)


def _unlinked_file() -> int:
    directory = tempfile.gettempdir()
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (AttributeError, OSError):  # a file system without O_TMPFILE
        fd, path = tempfile.mkstemp(prefix="journalfs-object-", dir=directory)
        os.unlink(path)
        return fd


def _merged(ranges, size: int) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted((max(0, lo), min(size, hi)) for lo, hi in ranges):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]
