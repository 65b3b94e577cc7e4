"""What the formats' demo samples (:meth:`Codec.demo_files`) and record generators share: the
demo's clock and realistic payload text. Deterministic from the ``random.Random`` given."""
from __future__ import annotations

import random

#: 2023-11-14T22:13:20Z in ms / s / ns: the demo's clock starts here.
BASE_MS = 1_700_000_000_000
BASE_S = BASE_MS // 1000
BASE_NS = BASE_MS * 1_000_000

#: Payload sizes (bytes) of :meth:`Codec.sample_file`'s records, where a format has payloads:
#: small records, the parse benchmark's hard case.
SAMPLE_PAYLOAD = (16, 100)

WORDS = ("invoice", "resize", "thumbnail", "email", "backup", "index", "report", "sync",
         "upload", "audit", "ledger", "order", "refund", "ship", "notify")


def text(rng: random.Random, lo: int, hi: int) -> bytes:
    """A whole JSON object of ``lo..hi`` bytes, as a queue's producer would put: a task, a
    number, who sent it, and a ``note`` of words filling it to the size drawn (realistic,
    compressible, not random noise). Below ~40 bytes the fullest object that fits (at least
    12 bytes; then a bare JSON number cut to the size)."""
    size = rng.randint(lo, hi)
    task, n, by = rng.choice(WORDS), rng.randrange(10**6), rng.choice(WORDS)
    heads = (f'{{"task":"{task}","n":{n},"by":"{by}"', f'{{"task":"{task}","n":{n}', f'{{"n":{n}')
    for head in heads:
        room = size - len(head) - len(',"note":""}')
        if room >= 0:
            note = (f"{task} {by} " * (room // 2 + 1))[:room]
            return f'{head},"note":"{note}"}}'.encode()
    for head in heads:
        if len(head) + 1 <= size:
            return f"{head}}}".encode()
    return str(n).encode()[:size]
