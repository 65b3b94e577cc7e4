"""status.json's builder (journalfs/fs/status.py), in-process with trio's mock clock: an open
always gets a build that started after it, within a bounded wait, whatever the schedule."""
from __future__ import annotations

import logging
import random

import pytest
import trio
import trio.testing

from journalfs.fs import status as status_module
from journalfs.fs.status import BUILD_INTERVAL, BUILD_MARGIN, STUCK_BUILD, StatusFile

pytestmark = pytest.mark.fast


async def _schedule(seed: int) -> None:
    """Readers arriving at random moments (many at once, right at a build's end, during
    one), builds of random length (none that yields at all, some longer than the interval)."""
    rnd = random.Random(seed)
    changes = {"n": 0}

    async def build():
        seen = changes["n"]
        pause = rnd.choice([0, 0, 0.001, 0.3, BUILD_INTERVAL, 1.5, 4.0])
        if pause:
            await trio.sleep(pause)
        return b"%d" % seen

    status = StatusFile(build)

    async def reader(at: float) -> None:
        await trio.sleep(at)
        changes["n"] += 1
        before = changes["n"]
        start = trio.current_time()
        data = await status.current()
        waited = trio.current_time() - start
        assert int(data) >= before, "a read older than its open"
        # the next build starts within an interval of the last one's end and lasts <= 4 s:
        # a reader never needs the safety net
        assert waited <= 2 * (BUILD_INTERVAL + 4.0) + 0.01, waited

    async with trio.open_nursery() as nursery:
        nursery.start_soon(status.run)
        async with trio.open_nursery() as readers:
            for _ in range(rnd.randint(1, 25)):
                readers.start_soon(reader, rnd.choice(
                    [0, 0.3, BUILD_INTERVAL, BUILD_INTERVAL + 1e-4, rnd.random() * 12]))
        assert status.rescued == 0
        nursery.cancel_scope.cancel()


def test_no_schedule_loses_a_wake_up():
    for seed in range(400):
        trio.run(_schedule, seed, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.daemon_log_errors(r"ERROR status.json: no build after 60 s",
                               reason="the test's build never ends: the safety net logs it")
def test_a_build_that_never_ends_is_done_by_the_open_and_logged_with_its_place(caplog):
    """The safety net for a stuck build: the open builds the document itself after
    STUCK_BUILD seconds and logs an ERROR saying where the background task waits."""
    calls = {"n": 0}

    async def build():
        calls["n"] += 1
        if calls["n"] == 1:  # the background task's build: never ends
            await trio.sleep_forever()
        return b"by the open"

    async def main():
        status = StatusFile(build)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(status.run)
            await trio.sleep(0.1)
            start = trio.current_time()
            assert await status.current() == b"by the open"
            waited = trio.current_time() - start
            assert STUCK_BUILD <= waited < STUCK_BUILD + BUILD_INTERVAL + BUILD_MARGIN
            assert status.rescued == 1
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.ERROR, logger=status_module.log.name):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    message = record.getMessage()
    assert "building too long" in message and "built by the open" in message
    assert "in _build_now" in message and "in build" in message and "sleep_forever" in message


@pytest.mark.daemon_log_errors(r"ERROR status.json: no build after 5 s",
                               reason="the test loses the wake-up on purpose: the safety net "
                                      "logs it")
def test_a_lost_wake_up_is_noticed_within_the_margin(caplog):
    """Were the background task ever left waiting on an event no reader sets (here made
    so by hand), the open builds the document itself after BUILD_INTERVAL + BUILD_MARGIN
    and the ERROR says the task was not woken."""
    async def build():
        return b"built"

    async def main():
        status = StatusFile(build)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(status.run)
            await trio.sleep(0.1)  # the task waits on its event: swap it for one nobody watches
            status._wanted = trio.Event()
            start = trio.current_time()
            assert await status.current() == b"built"
            assert trio.current_time() - start == pytest.approx(BUILD_INTERVAL + BUILD_MARGIN)
            nursery.cancel_scope.cancel()

    with caplog.at_level(logging.ERROR, logger=status_module.log.name):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "not woken" in record.getMessage() and "in run" in record.getMessage()
