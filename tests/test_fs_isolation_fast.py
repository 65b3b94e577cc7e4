"""Issue 24's mechanisms, in-process (fast tier): what may wait leaves the request thread,
each user gets a fair share of the workers, status.json is not built by a stat, the maps
keyed by files are bounded, names are escaped before any log line."""
from __future__ import annotations

import fcntl
import logging
import os
import signal

import pyfuse3
import pytest
import trio
import trio.testing

from fastops import ROOT, Ctx, listdir, lookup_path, serving
from journalfs.escaping import EscapingFormatter, escaped
from journalfs.fs import workers as workers_module
from journalfs.fs.inodes import InodeTable
from journalfs.fs.mountcore import SCAN_INLINE
from journalfs.fs.workers import FairWorkers

pytestmark = pytest.mark.fast


def run(source, scenario, **kwargs):
    async def main():
        async with serving(source, source.parent / "store", sync="none", **kwargs) as ops:
            return await scenario(ops)
    return trio.run(main)


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "small").mkdir(parents=True)
    (src / "big").mkdir()
    for i in range(5):
        (src / "small" / f"f{i}").write_bytes(b"x")
    for i in range(SCAN_INLINE * 3):
        (src / "big" / f"n{i:05d}").write_bytes(b"")
    (src / "plain").write_bytes(b"data")
    return src


def test_big_directory_scans_leave_the_request_thread(source):
    async def scenario(ops):
        small = await lookup_path(ops, "small")
        big = await lookup_path(ops, "big")
        before = ops.workers.calls
        assert len(await listdir(ops, small.st_ino)) == 5
        assert ops.workers.calls == before  # done inline: no thread hop
        names = await listdir(ops, big.st_ino, Ctx(uid=1234))
        assert len(names) == SCAN_INLINE * 3 and names == sorted(names)
        assert ops.workers.calls == before + 1  # the rest of the scan ran in a worker
    run(source, scenario, timeout=0)


def test_open_without_a_lease_stays_inline_and_with_one_goes_to_a_worker(source):
    previous = signal.signal(signal.SIGIO, lambda *_: None)  # the lease holder is us
    try:
        _lease_scenario(source)
    finally:
        signal.signal(signal.SIGIO, previous)


def _lease_scenario(source):
    async def scenario(ops):
        plain = await lookup_path(ops, "plain")
        before = ops.workers.calls
        info = await ops.open(plain.st_ino, os.O_RDONLY, ROOT)
        await ops.release(info.fh)
        assert ops.workers.calls == before
        # a read lease held on SOURCE: an open for writing would wait for its break
        holder = os.open(source / "plain", os.O_RDONLY)
        fcntl.fcntl(holder, 1024, fcntl.F_RDLCK)  # F_SETLEASE; its break signals SIGIO
        released = []

        async def release_later():
            await trio.sleep(0.2)
            fcntl.fcntl(holder, 1024, fcntl.F_UNLCK)
            released.append(True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            info = await ops.open(plain.st_ino, os.O_WRONLY, Ctx(uid=4321))
        # the open returned only after the lease was given up, in a worker thread, and
        # the trio thread served the releasing task meanwhile
        assert released and ops.workers.calls == before + 1
        await ops.release(info.fh)
        os.close(holder)
        flags = fcntl.fcntl(ops.files[max(ops.files)].fd, fcntl.F_GETFL) if ops.files else 0
        assert not flags & os.O_NONBLOCK
    run(source, scenario)


def test_the_nonblocking_attempt_leaves_no_o_nonblock_behind(source):
    async def scenario(ops):
        plain = await lookup_path(ops, "plain")
        info = await ops.open(plain.st_ino, os.O_RDWR, ROOT)
        assert not fcntl.fcntl(ops.files[info.fh].fd, fcntl.F_GETFL) & os.O_NONBLOCK
        await ops.release(info.fh)
        info = await ops.open(plain.st_ino, os.O_RDONLY | os.O_NONBLOCK, ROOT)
        assert fcntl.fcntl(ops.files[info.fh].fd, fcntl.F_GETFL) & os.O_NONBLOCK
        await ops.release(info.fh)
    run(source, scenario)


def test_one_user_never_takes_every_worker():
    async def main():
        workers = FairWorkers(total=8, per_user=2)
        gate = trio.Event()
        started = {"bob": 0, "carol": 0}

        def slow(who):
            started[who] += 1
            trio.from_thread.run(gate.wait)

        async with trio.open_nursery() as nursery:
            for _ in range(6):  # bob's six slow calls: only two run
                nursery.start_soon(workers.run, 1001, slow, "bob")
            await trio.sleep(0.3)
            assert started["bob"] == 2 and workers.busy() == {1001: 6}
            assert await workers.run(1002, lambda: "carol served") == "carol served"
            gate.set()
        assert workers.busy() == {}  # the per-user map holds only users with calls in flight
    trio.run(main)


def test_status_json_is_not_built_by_a_stat(source):
    async def scenario(ops):
        views = ops.views
        status = views.status
        for _ in range(50):
            attrs = await ops.getattr(status.ino, ROOT)
            assert attrs.st_size == 0  # tells nobody anything
        assert views.status_file.builds == 0
        info = await views.open(status.ino)
        assert views.status_file.builds == 1 and b'"damaged_journals"' in views.files[info.fh]
        views.release(info.fh)
    run(source, scenario)


def test_foreign_numbers_are_bounded(tmp_path):
    root_fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        table = InodeTable(root_fd)
        table.max_foreign = 100
        for ino in range(1000):
            table.number((table.root_dev + 1, ino))
        assert len(table._foreign) <= 100
        assert table.number((table.root_dev + 1, 999)) == table.number((table.root_dev + 1, 999))
    finally:
        os.close(root_fd)


def test_names_are_escaped_as_journalctl_does():
    hostile = b"x.jrnl\n2026-11-27 journalfs[1]: INFO forged\x1b[31m\xff\\"
    shown = escaped(hostile)
    assert shown == "x.jrnl\\n2026-11-27 journalfs[1]: INFO forged\\x1b[31m\\xff\\\\"
    assert shown.isprintable()
    assert escaped("r\u00e9sum\u00e9") == "r\u00e9sum\u00e9"  # printable text stays as is
    assert escaped("a\u2028b\u202ec\x85") == "a\\u2028b\\u202ec\\u0085"
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "damaged journal %s",
                               (os.fsdecode(hostile),), None)
    line = EscapingFormatter("%(message)s").format(record)
    assert "\n" not in line and "\x1b" not in line


def test_worker_module_defaults_leave_room_for_others():
    assert workers_module.PER_USER_THREADS * 2 <= workers_module.TOTAL_THREADS


def test_status_json_builds_at_most_once_a_second_and_never_older_than_the_open():
    from journalfs.fs.status import BUILD_INTERVAL, StatusFile

    async def main():
        state = {"n": 0}

        async def build():
            state["n"] += 1
            return b"%d" % state["n"]
        status = StatusFile(build)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(status.run)
            while not status.running:
                await trio.sleep(0)
            start = trio.current_time()
            first = await status.current()
            state["n"] += 10  # something changed after that read
            readers = []

            async def read():
                readers.append(await status.current())
            async with trio.open_nursery() as many:
                for _ in range(20):
                    many.start_soon(read)
            # twenty readers shared one build, which started after the change
            assert first == b"1" and set(readers) == {b"12"} and status.builds == 2
            assert trio.current_time() - start >= BUILD_INTERVAL
            nursery.cancel_scope.cancel()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_acting_as_a_user_drops_the_capability_and_restores_it(monkeypatch):
    """Caller.as_user drops CAP_SYS_RESOURCE (here stood in for by CAP_SYS_ADMIN: this
    machine's root may lack CAP_SYS_RESOURCE altogether) and the fs capabilities for the
    call only, per thread."""
    from journalfs.fs import caller as caller_module

    def effective():
        return caller_module.capabilities()[1][0].effective

    if not effective() >> 21 & 1:
        pytest.skip("no CAP_SYS_ADMIN to stand in with")
    monkeypatch.setattr(caller_module, "_CAP_SYS_RESOURCE", 21)
    caller = caller_module.Caller()
    before = effective()
    inside = caller.as_user(1000, 1000, effective)
    assert not inside >> 21 & 1 and not inside >> 1 & 1  # CAP_SYS_ADMIN, CAP_DAC_OVERRIDE
    assert effective() == before
    assert caller.as_user(0, 5, effective) == before  # root keeps its capabilities
    with pytest.raises(ZeroDivisionError):
        caller.as_user(1000, 1000, lambda: 1 / 0)
    assert effective() == before


def test_a_users_index_work_pauses_once_over_its_cpu_budget():
    """The CPU budget of index work (issue 24 item 4): a user past ``burst`` CPU-seconds
    pauses until the bucket refilled at ``share`` a second; another user's budget is his
    own; the buckets and totals stay bounded whatever uids come."""
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    budget = workers_module.CpuBudget(share=0.5, burst=0.1, clock=lambda: now[0], sleep=sleep,
                                      contention=5.0)
    # alone: never paused (work-conserving), but charged, down to one burst of debt
    assert budget._charge(1001, 0.05) == 0
    assert budget._charge(1001, 3.0) == 0
    assert budget._left[1001][0] == pytest.approx(-0.1)
    now[0] += 100  # refilled
    assert budget._charge(1000, 0.001) == 0  # another user's index work: contention now
    assert budget._charge(1001, 0.05) == 0  # within the burst: no pause
    wait = budget._charge(1001, 0.1)        # 0.05 CPU-s over: 0.1 s at half a core
    assert wait == pytest.approx(0.1)
    assert budget._charge(1002, 0.05) == 0  # carol's budget is her own
    now[0] += 0.1
    assert budget._charge(1001, 0.0) == 0   # refilled meanwhile
    # a meter pauses its thread (in steps of at most INDEX_PAUSE_MAX) and counts it
    meter = budget.meter(1003)
    budget._charge(1003, 0.6)               # as if its thread had used 0.6 s already
    meter()  # its debt is at most one burst: 0.2 s
    assert sum(slept) == pytest.approx(0.2, abs=0.01)
    assert max(slept) <= workers_module.INDEX_PAUSE_MAX
    users = budget.status()["users"]
    assert users["1003"]["pauses"] == 1
    assert users["1003"]["paused_s"] == pytest.approx(0.2, abs=0.01)
    assert users["1002"]["pauses"] == 0
    now[0] += 10  # nobody else's work in the window: 1003 goes on unpaused
    assert budget._charge(1003, 5.0) == 0
    for uid in range(10_000, 10_000 + 3 * workers_module.INDEX_CPU_USERS):
        budget._charge(uid, 0.01)
        now[0] += 1  # every earlier bucket refills
    assert len(budget.totals) <= workers_module.INDEX_CPU_USERS
    assert len(budget._left) <= workers_module.INDEX_CPU_USERS + 1


def test_index_cpu_setting_falls_back_to_the_defaults():
    defaults = (workers_module.INDEX_CPU_SHARE, workers_module.INDEX_CPU_BURST)
    assert workers_module.index_cpu_setting("0.05,0.2") == (0.05, 0.2)
    for text in (None, "", "fast", "1", "0,1", "-1,2", "1,2,3"):
        assert workers_module.index_cpu_setting(text) == defaults


def test_workers_hand_the_interpreter_back_within_a_millisecond(monkeypatch):
    """A worker running Python (bob's scan, his indexing) keeps the interpreter lock at most
    SWITCH_INTERVAL while the request thread waits for it (CPython's default is 5 ms)."""
    import sys
    before = sys.getswitchinterval()
    try:
        monkeypatch.delenv("JOURNALFS_SWITCH_INTERVAL", raising=False)
        FairWorkers()
        assert sys.getswitchinterval() == pytest.approx(workers_module.SWITCH_INTERVAL)
        assert workers_module.SWITCH_INTERVAL <= 0.001
        monkeypatch.setenv("JOURNALFS_SWITCH_INTERVAL", "0.005")
        FairWorkers()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        monkeypatch.setenv("JOURNALFS_SWITCH_INTERVAL", "nonsense")
        FairWorkers()
        assert sys.getswitchinterval() == pytest.approx(workers_module.SWITCH_INTERVAL)
    finally:
        sys.setswitchinterval(before)


def test_one_owners_indexes_never_push_out_anothers():
    """The views' cache charges a journal's entries to its owner (issue 24 item 4): bob's
    many big indexes evict his own oldest, never carol's; the whole budget still holds."""
    from journalfs.fs.catalog import Catalog
    cat = Catalog(budget=10_000, entry_overhead=0, owner_budget=2_500)
    cat.put(("journal", b"carol/a"), "carol's", 2_000, 1002)
    for i in range(50):
        cat.put(("journal", b"bob/%d" % i), "bob's", 1_000, 1001)
        assert cat.owner_used(1001) <= 2_500
    assert cat.get(("journal", b"carol/a")) == "carol's"
    assert cat.get(("journal", b"bob/49")) == "bob's" and cat.get(("journal", b"bob/0")) is None
    cat.put(("journal", b"bob/huge"), "too big for his share", 3_000, 1001)
    assert cat.get(("journal", b"bob/huge")) is None and cat.owner_used(1001) <= 2_500
    # entries of no owner still share the whole budget, least recently used out first
    for i in range(20):
        cat.put(("scan", b"d%d" % i), True, 1_000)
    assert cat.used <= 10_000
    cat.discard_where(lambda key: key[1].startswith(b"bob/"))
    assert cat.owner_used(1001) == 0 and 1001 not in cat._owners
    cat.discard(("journal", b"carol/a"))
    assert cat.owner_used(1002) == 0 and not cat._owners
