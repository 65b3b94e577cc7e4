"""bench/fuse.py's report: journalfs ÷ floor beside journalfs ÷ bindfs (rates and CPU per
request), for --tree targets too, and the rows the floor does not run named with why."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from bench import fuse as bench_fuse


@pytest.fixture
def recorded():
    rec = bench_fuse.Recorder()
    names = ["native", "bindfs", "journalfs", "journalfs-main", "floor"]
    rates = {"native": 400.0, "bindfs": 100.0, "journalfs": 30.0, "journalfs-main": 20.0,
             "floor": 60.0}
    cpu = {"bindfs": 5.0, "journalfs": 36.0, "journalfs-main": 48.0, "floor": 24.0}
    row = rec.rows.setdefault("getxattr", bench_fuse.Row("getxattr", "ops/s"))
    for n, v in rates.items():
        row.values[n] = [v, v * 1.1, v * 0.9]
        if n in cpu:
            row.cpu_us[n] = [cpu[n]] * 3
    stale = rec.rows.setdefault("staleness after a SOURCE change", bench_fuse.Row(
        "staleness after a SOURCE change", "ms", "lower"))
    stale.values = {"bindfs": [1000.0], "journalfs": [1.0]}
    failed = rec.rows.setdefault("view ls -l, 10 records, cold", bench_fuse.Row(
        "view ls -l, 10 records, cold", "entries/s"))
    failed.values = {"journalfs": [5.0]}
    failed.note["floor"] = "failed: RuntimeError('x')"
    return rec, names


def test_report_puts_journalfs_over_the_floor_beside_journalfs_over_bindfs(recorded):
    rec, names = recorded
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        blob = bench_fuse.report(rec, names, {})
    text = out.getvalue()
    head = text.splitlines()[0]
    columns = [c.strip() for c in head.strip("| ").split(" | ")]
    at = columns.index("jfs/bindfs")
    assert columns[at:at + 4] == ["jfs/bindfs", "jfs/floor", "jfs-main/bindfs", "jfs-main/floor"]
    assert "jfs/floor CPU" in columns and "jfs-main/floor CPU" in columns
    getxattr = [line for line in text.splitlines() if line.startswith("| getxattr")][0]
    cells = [c.strip() for c in getxattr.strip("| ").split(" | ")]
    assert cells[columns.index("jfs/floor")] == "0.50"
    assert cells[columns.index("jfs/floor CPU")] == "1.50"
    assert cells[columns.index("jfs-main/floor CPU")] == "2.00"
    result = {r["workload"]: r for r in blob["results"]}["getxattr"]
    assert result["ratio_journalfs_floor"] == pytest.approx(0.5)
    assert result["ratio_journalfs_floor_cpu"] == pytest.approx(1.5)
    assert result["ratios"]["journalfs-main/floor"] == pytest.approx(20 / 60)
    assert result["cpu_ratios"]["journalfs-main/floor"] == pytest.approx(2.0)
    # the rows the floor did not run, and why
    assert set(blob["floor_not_run"]) == {"staleness after a SOURCE change",
                                          "view ls -l, 10 records, cold"}
    assert "never looks at SOURCE again" in blob["floor_not_run"]["staleness after a SOURCE change"]
    assert blob["floor_not_run"]["view ls -l, 10 records, cold"].startswith("failed")
    assert 'the floor does not run "staleness after a SOURCE change"' in text
    assert json.loads(text[text.index("\n{") + 1:])["floor_not_run"] == blob["floor_not_run"]


def test_view_rows_count_what_ls_lists(tmp_path):
    """ls -f lists . and .. where the filesystem does; ls -l's "total" line is no entry."""
    for i in range(3):
        (tmp_path / f"{i:08d}.index").touch()
    for command in bench_fuse.VIEW_COMMANDS.values():
        assert bench_fuse.list_view(command, tmp_path, 3) > 0
    with pytest.raises(RuntimeError, match="listed 3 of 4"):
        bench_fuse.list_view(["ls", "-U"], tmp_path, 4)


def test_a_tree_target_runs_that_trees_journalfs(tmp_path, monkeypatch):
    """--tree NAME=DIR: the daemon imports journalfs from DIR, even when the bench runs in
    another checkout (python -m puts its working directory first on sys.path)."""
    tree = tmp_path / "tree"
    (tree / "journalfs").mkdir(parents=True)
    (tree / "journalfs" / "__init__.py").write_text("")
    seen = tmp_path / "imported-from"
    (tree / "journalfs" / "cli.py").write_text(
        f"open({str(seen)!r}, 'w').write(__file__)\n")  # then exits: no mount
    monkeypatch.chdir(bench_fuse.REPO)
    target = bench_fuse.Target("journalfs-other", tmp_path / "src", tmp_path / "mnt",
                               tmp_path / "store", tree=tree)
    with pytest.raises(RuntimeError, match="did not mount"):
        target.mount(cold=False)
    assert seen.read_text() == str(tree / "journalfs" / "cli.py")


def test_rows_are_picked_by_name_or_pattern():
    assert bench_fuse.pick_rows("readdir,ls-l-cold") == ("ls-l-cold", "readdir")
    assert bench_fuse.pick_rows("fio-*") == ("fio-randread", "fio-randwrite", "fio-create",
                                            "fio-seqread")
    with pytest.raises(ValueError, match="no row is named 'fio'"):
        bench_fuse.pick_rows("fio")
    # a warm row's cold row runs first (unrecorded); nothing else does
    rec = bench_fuse.Recorder(bench_fuse.pick_rows("stat-warm"))
    assert rec.wants("stat-cold") and not rec.wants("ls-l-cold", "readdir")
    assert all(need in bench_fuse.ROWS for needs in bench_fuse.ROW_NEEDS.values()
               for need in needs)


def test_listing_rows_compare_cpu_per_entry():
    """On a row whose CPU is counted per entry, jfs/floor CPU compares per entry (the
    requests carry different numbers of entries); the per-request figures stay in the JSON."""
    rec = bench_fuse.Recorder()
    row = rec.rows.setdefault("readdir (entries/s)", bench_fuse.Row(
        "readdir (entries/s)", "entries/s", cpu_unit="entry"))
    row.values = {"journalfs": [100.0], "floor": [100.0]}
    # journalfs: 10 requests for 10,000 entries; the floor 55 for as many
    row.cpu_us = {"journalfs": [300.0], "floor": [80.0]}
    row.cpu_us_per_unit = {"journalfs": [0.3], "floor": [0.44]}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        blob = bench_fuse.report(rec, ["journalfs", "floor"], {})
    lines = out.getvalue().splitlines()
    columns = [c.strip() for c in lines[0].strip("| ").split(" | ")]
    cells = [c.strip() for c in lines[2].strip("| ").split(" | ")]
    assert cells[columns.index("CPU µs per")] == "entry"
    assert cells[columns.index("journalfs CPU µs")] == "0.3"
    assert cells[columns.index("jfs/floor CPU")] == "0.68"
    result = blob["results"][0]
    assert result["cpu_unit"] == "entry"
    assert result["ratio_journalfs_floor_cpu"] == pytest.approx(0.3 / 0.44)
    assert result["cpu_ratios_per_request"]["journalfs/floor"] == pytest.approx(300 / 80)
    assert result["cpu_us_per_request"]["journalfs"]["median"] == 300.0


@pytest.mark.fuse
def test_a_rows_run_measures_exactly_those_rows(tmp_path):
    """A real run of two rows on native, journalfs and the floor (tiny sizes): the JSON has
    exactly those rows, the listing rows' CPU per entry and per request, every FUSE target's
    wait for a settled daemon, and no row failed."""
    if os.geteuid() != 0 or not bench_fuse.RequestCounter.available():
        pytest.skip("the bench counts requests on tracefs: root only")
    out = tmp_path / "out.json"
    run = subprocess.run(
        [sys.executable, str(bench_fuse.REPO / "bench" / "fuse.py"), "--workdir",
         str(tmp_path / "work"), "--files", "200", "--rounds", "1", "--view-records", "300",
         "--view-ls-l-records", "300", "--rows", "readdir,ls-l-warm,getfattr-r,mv-500,view-ls-l-w*",
         "--only", "native,journalfs,floor",
         "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    blob = json.loads(out.read_text())
    results = {r["workload"]: r for r in blob["results"]}
    assert blob["rows"] == ["readdir", "ls-l-warm", "getfattr-r", "mv-500", "view-ls-l-warm"]
    # the warm rows brought their cold listings along (and journalfs its view's first,
    # indexing, listing), unrecorded
    assert set(results) == {"readdir (entries/s)", "ls -l 2000 entries, warm",
                            "getfattr -R, 5,005 files", "500 x mv (whole command)",
                            "view ls -l, 300 records, warm"}
    for r in results.values():
        assert not r["notes"] or not any(n.startswith("failed") for n in r["notes"].values()), r
        assert set(r["values"]) == {"native", "journalfs", "floor"}
        assert set(r["settle_s"]) == {"journalfs", "floor"}
    for name, unit in (("readdir (entries/s)", "entry"), ("ls -l 2000 entries, warm", "entry"),
                       ("view ls -l, 300 records, warm", "entry"),
                       ("getfattr -R, 5,005 files", "file"), ("500 x mv (whole command)", "request")):
        r = results[name]
        assert r["cpu_unit"] == unit
        for target in ("journalfs", "floor"):
            per_unit = r["cpu_us_per_unit"][target]["median"]
            per_request = r["cpu_us_per_request"][target]["median"]
            assert per_unit > 0 and per_request > 0
            if unit == "request":
                assert per_unit == per_request
        assert r["ratio_journalfs_floor_cpu"] == pytest.approx(
            r["cpu_us_per_unit"]["journalfs"]["median"] / r["cpu_us_per_unit"]["floor"]["median"])
    # readdir: 5 listings of 200 names in a few requests, so CPU per entry is far below
    # CPU per request
    readdir = results["readdir (entries/s)"]
    assert sum(readdir["requests"]["journalfs"]) < 5 * 200
    assert (readdir["cpu_us_per_unit"]["journalfs"]["median"]
            < readdir["cpu_us_per_request"]["journalfs"]["median"])
    # nothing of mv-500's set-up in SOURCE is left
    assert not list((tmp_path / "work" / "src").glob("mv-*"))


def test_a_row_starts_once_the_daemon_stopped_working(tmp_path):
    """settle() returns only after the daemon's CPU time stopped moving: a stand-in daemon
    that works (burns CPU) until it writes a marker, then sleeps."""
    done = tmp_path / "done"
    busy = subprocess.Popen([sys.executable, "-c", (
        "import time, pathlib\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end: pass\n"
        f"pathlib.Path({str(done)!r}).write_text('idle')\n"
        "time.sleep(60)\n")])
    try:
        target = bench_fuse.Target("floor", tmp_path, tmp_path / "mnt")
        target.proc = busy
        waited = bench_fuse.settle(target)
        assert done.exists()
        assert waited >= bench_fuse.SETTLE_WINDOW
        target.proc = None  # not a mount: nothing to unmount
    finally:
        busy.kill()
        busy.wait()
