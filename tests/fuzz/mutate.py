"""Mutation fuzzing of the codecs: the engine shared by tests/test_fuzz.py and tests/fuzz/soak.py.

A case is one codec and one input (a seed after a few random mutations). Every entry point of
the codec (``read``, ``read_columns`` whole and in resumed batches, ``validate``, ``repair``) runs
on it under a wall-clock alarm and a tracemalloc peak bound. Allowed outcomes: records, and
:class:`FormatError`; anything else (another exception, a hang, a giant allocation, records that
break the interface's invariants, a repair that loses a valid record) is a :class:`Defect`.
"""
from __future__ import annotations

import contextlib
import json
import random
import signal
import traceback
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from codec_helpers import read_all
from journalfs.commands.fsck import lost_record
from journalfs.formats import CODECS, Codec, Columns, FormatError, detect, record_json_line
from journalfs.journals import related_files

#: Per-case limits: seconds of wall clock, and bytes of Python/numpy allocation beyond the input.
CASE_SECONDS = 5.0
MEMORY_SLACK = 64 << 20
MEMORY_PER_INPUT_BYTE = 10
#: Values a size/offset/count field is set to by the field mutator.
HOSTILE_VALUES = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1,
                  2**63 - 1, 2**63, 2**64 - 1)


@dataclass
class Seed:
    codec: str
    label: str
    data: bytes
    context: dict[str, bytes] = field(default_factory=dict)


class Defect(AssertionError):
    """A codec did something other than return records or raise FormatError."""


class _CaseTimeout(BaseException):  # BaseException: a codec's `except Exception` must not eat it
    pass


# -- seeds --------------------------------------------------------------------------------------

def corpus_seeds(records_dir: Path, vectors: dict) -> list[Seed]:
    """Every conformance file (with its related files as context) and every byte vector."""
    seeds = []
    for path in sorted(p for p in records_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        codec = detect(data[:64])
        if codec is None:
            continue
        context = {k: Path(v).read_bytes() for k, v in related_files(str(path), codec).items()}
        seeds.append(Seed(codec.name, str(path.relative_to(records_dir)), data, context))
    for name, vector in sorted(vectors.items()):
        seeds.append(Seed(vector["format"], f"vector:{name}", bytes.fromhex(vector["hex"])))
    return seeds


def writer_seeds(seeds: list[Seed]) -> list[Seed]:
    """Each codec's own writer output: the records of every seed, written back."""
    out = []
    for seed in seeds:
        codec = CODECS[seed.codec]
        records = []
        with contextlib.suppress(FormatError):
            records.extend(codec.read(seed.data, seed.label))
        if records:
            try:
                data = codec.write(records)
            except NotImplementedError:
                continue
            out.append(Seed(seed.codec, f"written:{seed.label}", data, seed.context))
    return out


# -- mutations ----------------------------------------------------------------------------------

def _flip_bits(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)


def _truncate(data: bytearray, rng: random.Random) -> None:
    del data[rng.randrange(len(data) + 1):]


def _insert(data: bytearray, rng: random.Random) -> None:
    pos = rng.randrange(len(data) + 1)
    data[pos:pos] = rng.randbytes(rng.choice((1, 2, 3, 4, 8, 16, 100)))


def _delete(data: bytearray, rng: random.Random) -> None:
    pos = rng.randrange(len(data))
    del data[pos:pos + rng.choice((1, 2, 3, 4, 8, 16, 100))]


def _set_field(data: bytearray, rng: random.Random) -> None:
    """An aligned 1/2/4/8-byte field (either byte order) set to a hostile value."""
    width = rng.choice((1, 2, 4, 4, 8, 8))
    if len(data) < width:
        return
    pos = rng.randrange(0, len(data) - width + 1)
    if rng.random() < 0.7:
        pos -= pos % width
    value = rng.choice(HOSTILE_VALUES) & ((1 << (8 * width)) - 1)
    data[pos:pos + width] = value.to_bytes(width, rng.choice(("little", "big")))


def _zero_run(data: bytearray, rng: random.Random) -> None:
    pos = rng.randrange(len(data))
    n = rng.choice((1, 4, 8, 64, 4096))
    data[pos:pos + n] = bytes(len(data[pos:pos + n]))


def _duplicate(data: bytearray, rng: random.Random) -> None:
    pos = rng.randrange(len(data))
    chunk = data[pos:pos + rng.choice((4, 16, 64, 256))]
    at = rng.randrange(len(data) + 1)
    data[at:at] = chunk


MUTATORS: tuple[Callable[[bytearray, random.Random], None], ...] = (
    _flip_bits, _truncate, _insert, _delete, _set_field, _set_field, _zero_run, _duplicate)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """1-3 random mutations, keeping the magic intact most of the time (so the codec, not
    detection, sees the damage)."""
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        if not out:
            break
        rng.choice(MUTATORS)(out, rng)
    if rng.random() < 0.85 and len(out) >= 8 and len(data) >= 8:
        out[:4] = data[:4]
    return bytes(out)


def mutated_case(seed: Seed, rng: random.Random) -> tuple[bytes, dict[str, bytes]]:
    """The seed's bytes mutated, or (sometimes) intact bytes with a mutated context file."""
    if seed.context and rng.random() < 0.2:
        name = rng.choice(sorted(seed.context))
        return seed.data, {**seed.context, name: mutate(seed.context[name], rng)}
    return mutate(seed.data, rng), seed.context


# -- running one case ---------------------------------------------------------------------------

@contextlib.contextmanager
def _deadline(seconds: float):
    def on_alarm(signum, frame):
        raise _CaseTimeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check_records(codec: Codec, data: bytes, records: list[dict]) -> None:
    last = -1
    for i, rec in enumerate(records):
        if rec.get("seq") != i or rec.get("format") != codec.name or rec.get("kind") not in codec.kinds:
            raise Defect(f"record {i} breaks the interface: {dict(list(rec.items())[:5])}")
        offset = rec.get("offset")
        if not (isinstance(offset, int) and last < offset < len(data)):
            raise Defect(f"record {i}: offset {offset} not increasing inside the {len(data)}-byte file")
        last = offset
        _check_json(rec, i)


def _check_json(rec: dict, i: int) -> None:
    """The record prints as one valid JSON line (as `journalfs records --json` writes it)."""
    try:
        line = record_json_line(rec).encode("utf-8", "backslashreplace")
        json.loads(line)
    except (TypeError, ValueError) as exc:
        raise Defect(f"record {i} does not print as JSON: {exc}") from None
    if b"\n" in line:
        raise Defect(f"record {i} prints as more than one line")


def _check_error(exc: FormatError | None, data: bytes, source: str) -> None:
    if exc is not None and not (exc.source == source and 0 <= exc.offset <= len(data)):
        raise Defect(f"FormatError names {exc.source!r} at byte {exc.offset} (file has {len(data)})")


def exercise(codec: Codec, data: bytes, context: dict[str, bytes], source: str = "fuzz") -> None:
    """Every codec entry point on ``data``; raises :class:`Defect` on any misbehaviour."""
    records, error = read_all(codec, data, source)
    _check_records(codec, data, records)
    _check_error(error, data, source)
    columns = _columns(codec, data, source)
    if columns.rows != len(records) or (columns.error is None) != (error is None):
        raise Defect(f"read_columns: {columns.rows} rows, error {columns.error}; "
                     f"read: {len(records)} records, error {error}")
    if codec.resumable:
        _batched_columns(codec, data, source, len(records))
    if codec.resumable and len(records) > 2:  # resuming at a record boundary
        mid = records[len(records) // 2]
        again, _ = read_all(codec, data, source, start=mid["offset"], seq=mid["seq"])
        if not again or again[0]["offset"] != mid["offset"] or again[0]["seq"] != mid["seq"]:
            raise Defect(f"resuming at byte {mid['offset']} gave {again[:1]}")
    for finding in _call_validating(codec.validate, data, source, context):
        if not 0 <= finding.offset <= max(len(data), *(len(v) for v in context.values()), 0):
            raise Defect(f"validate: finding at byte {finding.offset} outside the file")
    fix = _call_validating(codec.repair, data, source, context)
    if fix is not None:
        refusal = lost_record(data, bytes(fix.data), source, codec)
        if refusal:
            raise Defect(f"repair would drop a valid record: {refusal}")


def _columns(codec: Codec, data: bytes, source: str, **kw) -> Columns:
    """``read_columns``; damage raised instead of returned counts as zero rows + that error."""
    try:
        return codec.read_columns(data, source, **kw)
    except FormatError as exc:
        return Columns({}, 0, None, kw.get("seq", 0), exc)


def _batched_columns(codec: Codec, data: bytes, source: str, expected_rows: int) -> None:
    rows, start, seq = 0, None, 0
    for _ in range(expected_rows + 2):
        cols = _columns(codec, data, source, start=start, seq=seq, limit=7)
        rows += cols.rows
        if cols.next_offset is None or cols.error is not None:
            break
        if cols.rows == 0:
            raise Defect(f"read_columns(limit=7) made no progress at byte {start}")
        start, seq = cols.next_offset, cols.next_seq
    if rows != expected_rows:
        raise Defect(f"read_columns in batches of 7 gave {rows} rows, read gave {expected_rows}")


def _call_validating(fn, data: bytes, source: str, context: dict[str, bytes]):
    try:
        return fn(data, source, **context)
    except FormatError:
        return [] if fn.__name__ == "validate" else None


def run_case(codec: Codec, data: bytes, context: dict[str, bytes],
             seconds: float = CASE_SECONDS) -> None:
    """:func:`exercise` under the time and memory bounds (tracemalloc must be tracing)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        with _deadline(seconds):
            exercise(codec, data, context)
    except _CaseTimeout:
        raise Defect(f"no result within {seconds} s (hang?)") from None
    except Defect:
        raise
    except Exception as exc:
        raise Defect("unexpected exception: " + "".join(
            traceback.format_exception_only(exc)).strip() + "\n" + traceback.format_exc()) from exc
    peak = tracemalloc.get_traced_memory()[1] - base
    allowed = MEMORY_SLACK + MEMORY_PER_INPUT_BYTE * (len(data) + sum(map(len, context.values())))
    if peak > allowed:
        raise Defect(f"allocated {peak} bytes at peak (bound {allowed})")


@dataclass
class Failure:
    codec: str
    seed: str
    data: bytes
    reason: str
    context: dict[str, bytes] = field(default_factory=dict)  # as handed to validate/repair


def fuzz(seeds: list[Seed], rng: random.Random, keep_going: Callable[[int], bool],
         max_failures: int = 20) -> Iterator[Failure]:
    """Round-robin over ``seeds`` while ``keep_going(cases_so_far)``; yields each failure."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        cases = failures = 0
        while keep_going(cases) and failures < max_failures:
            seed = seeds[cases % len(seeds)]
            data, context = mutated_case(seed, rng)
            cases += 1
            try:
                run_case(CODECS[seed.codec], data, context)
            except Defect as defect:
                failures += 1
                yield Failure(seed.codec, seed.label, data, str(defect), context)
    finally:
        if started:
            tracemalloc.stop()


def describe(failure: Failure) -> str:
    return (f"{failure.codec} from {failure.seed} ({len(failure.data)} bytes, "
            f"hex {failure.data[:48].hex()}{'…' if len(failure.data) > 48 else ''}): "
            f"{failure.reason}")

