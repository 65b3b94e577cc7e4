"""kill -9 soak: hundreds of crash trials of the MetaStore writer (tests/test_crash.py's rig).

    .venv/bin/python bench/crash_soak.py [--trials 200] [--modes always,batch,none] [--seed 1]

Each trial starts a writer on the same store, kills it at a random point (writes and
rotations), then checks every acknowledged write survived and that journalfs and GIO (a
private real gvfsd-metadata session) read the same store. Prints a table and a JSON blob.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gvfsd import GvfsSession  # noqa: E402
from test_crash import CrashRig  # noqa: E402


def soak(mode: str, trials: int, seed: int, session: GvfsSession) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"crash-{mode}-") as work:
        rig = CrashRig(Path(work), session, mode, seed)
        started = time.monotonic()
        failures, acked, finished, leftovers, left_files = [], 0, 0, 0, 0
        for i in range(trials):
            try:
                r = rig.trial()
            except BaseException as exc:  # noqa: BLE001 - a failed trial is a result
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append(f"trial {i}: {str(exc).splitlines()[0][:300]}")
                rig.state = rig._read_journalfs()  # go on from what is there
                continue
            acked += r["acked"]
            finished += r["finished"]
            leftovers += r["killed_in_rotation"]
            left_files = r["leftover_files"]
        return {"mode": mode, "trials": trials, "failed": len(failures), "acked_ops": acked,
                "writer_finished": finished, "killed_in_rotation": leftovers, "leftover_files": left_files,
                "seconds": round(time.monotonic() - started, 1), "failures": failures[:20]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--modes", default="always,batch,none")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with GvfsSession() as session:
        results = [soak(m, args.trials, args.seed, session) for m in args.modes.split(",")]
    print(f"{'mode':8} {'trials':>6} {'failed':>6} {'acked ops':>9} {'finished':>8} {'in rotation':>11} "
          f"{'leftovers':>9} {'s':>7}")
    for r in results:
        print(f"{r['mode']:8} {r['trials']:6} {r['failed']:6} {r['acked_ops']:9} {r['writer_finished']:8} "
              f"{r['killed_in_rotation']:11} {r['leftover_files']:9} {r['seconds']:7}")
        for f in r["failures"]:
            print("  ", f)
    print(json.dumps({"crash_soak": results}))
    return 1 if any(r["failed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
