"""Long mutation-fuzz soak, run by hand:

    .venv/bin/python tests/fuzz/soak.py [MINUTES] [--format NAME] [--seed N] [--out DIR]

Same engine and seeds as tests/test_fuzz.py; failing inputs are written to DIR
(default bench/out/fuzz-failures) and summarised at the end. Exit 1 when any defect was found.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from conftest import CONFORMANCE  # noqa: E402
from fuzz.mutate import corpus_seeds, describe, fuzz, writer_seeds  # noqa: E402
from test_fuzz import gvfs_seeds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("minutes", type=float, nargs="?", default=10.0)
    parser.add_argument("--format", help="fuzz only this format")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out", type=Path, default=TESTS.parent / "bench" / "out" / "fuzz-failures")
    args = parser.parse_args()

    vectors = json.loads((CONFORMANCE / "vectors.json").read_text())
    corpus = corpus_seeds(CONFORMANCE / "records", vectors) + gvfs_seeds()
    seeds = [s for s in corpus + writer_seeds(corpus) if args.format in (None, s.codec)]
    if not seeds:
        print(f"no seeds for format {args.format!r}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + 60 * args.minutes
    cases = Counter()

    def keep_going(n: int) -> bool:
        cases["total"] = n
        if n and n % 5000 == 0:
            print(f"{n} cases, {int(deadline - time.monotonic())} s left", flush=True)
        return time.monotonic() < deadline

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"soak: {len(seeds)} seeds, rng seed {args.seed}, {args.minutes} min", flush=True)
    failures = 0
    for failure in fuzz(seeds, random.Random(args.seed), keep_going, max_failures=10**9):
        failures += 1
        path = args.out / f"{failure.codec}-{args.seed}-{failures}.bin"
        path.write_bytes(failure.data)
        for name, data in failure.context.items():  # validate/repair's related files
            path.with_suffix(f".{name}.bin").write_bytes(data)
        print(f"DEFECT {path.name}: {describe(failure)}", flush=True)
    print(f"soak done: {cases['total']} cases, {failures} defects")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
