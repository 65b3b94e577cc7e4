"""bench/fuse.py's report: journalfs ÷ floor beside journalfs ÷ bindfs (rates and CPU per
request), for --tree targets too, and the rows the floor does not run named with why."""
from __future__ import annotations

import contextlib
import io
import json

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
