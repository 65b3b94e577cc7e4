"""A readdir reply of a mirrored directory goes in bounded steps and lets waiting requests
through between them (fast tier, in-process; the kernel's queue is a pipe here, looked at
with the same poll as /dev/fuse): a user listing alone gets everything the kernel's buffer
takes in one reply; a request waiting in the kernel runs after one step, and replies then
stay one step long while others use the mount; trio's other tasks (a request whose worker
thread is done) run at least every CHECKPOINT_SECONDS of a long reply."""
from __future__ import annotations

import os

import pytest
import trio

from fastops import ReplyBuffer, lookup_path, serving
from journalfs.fs import workers
from journalfs.fs.dirops import READDIR_NEW_MAX, READDIR_STEP
from journalfs.fs.workers import KernelQueue

pytestmark = pytest.mark.fast

ENTRIES = READDIR_STEP * 5 + 3


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "big").mkdir(parents=True)
    for i in range(ENTRIES):
        (src / "big" / f"n{i:04d}").write_bytes(b"")
    return src


@pytest.fixture
def queue():
    """A KernelQueue on a pipe: something "waits" while the pipe holds a byte."""
    read_end, write_end = os.pipe()
    yield KernelQueue(read_end), write_end
    os.close(read_end)
    os.close(write_end)


async def one_reply(ops, ino: int, seen: list[int] | None = None) -> ReplyBuffer:
    """One readdir call with a buffer that takes every entry; with ``seen``, another task
    notes how many entries the reply held each time it got to run meanwhile."""
    fh = await ops.opendir(ino, None)
    token = ReplyBuffer()
    try:
        if seen is None:
            await ops.readdir(fh, 0, token)
            return token
        async with trio.open_nursery() as nursery:
            async def other_request():
                while True:
                    seen.append(len(token))
                    await trio.sleep(0)
            nursery.start_soon(other_request)
            await ops.readdir(fh, 0, token)
            nursery.cancel_scope.cancel()
        return token
    finally:
        await ops.releasedir(fh)


def run(source, scenario):
    async def main():
        async with serving(source, source.parent / "store", sync="none", timeout=0) as ops:
            return await scenario(ops)
    return trio.run(main)


def test_a_user_listing_alone_gets_one_reply_without_yielding(source, queue, monkeypatch):
    kernel, _ = queue
    monkeypatch.setattr(workers, "CHECKPOINT_SECONDS", 3600.0)

    async def scenario(ops):
        ops.kernel_queue = kernel
        ino = (await lookup_path(ops, "big")).st_ino
        for _ in range(2):  # (each time every inode built, READDIR_NEW_MAX per step)
            seen: list[int] = []
            token = await one_reply(ops, ino, seen)
            assert len(token) == ENTRIES + 2  # . and .., and every name: one request
            assert sorted(name for name, _, _ in token)[2:] == \
                sorted(os.fsencode(f"n{i:04d}") for i in range(ENTRIES))
            assert set(seen) <= {0, ENTRIES + 2}  # nobody else ran in the middle
        assert kernel.yields == kernel.checkpoints == 0
    run(source, scenario)


def test_trios_other_tasks_run_between_steps_past_the_checkpoint_time(source, queue,
                                                                      monkeypatch):
    kernel, _ = queue  # nothing waits in the kernel
    monkeypatch.setattr(workers, "CHECKPOINT_SECONDS", 0.0)

    async def scenario(ops):
        ops.kernel_queue = kernel
        ino = (await lookup_path(ops, "big")).st_ino
        await one_reply(ops, ino)  # every inode built
        seen: list[int] = []
        assert len(await one_reply(ops, ino, seen)) == ENTRIES + 2
        grew = [b - a for a, b in zip(seen, seen[1:]) if b > a]
        assert len(grew) >= ENTRIES // READDIR_STEP - 1 and max(grew) <= READDIR_STEP + 2
        assert kernel.yields == 0 and kernel.checkpoints > 0
    run(source, scenario)


def test_a_waiting_request_runs_after_one_step_and_then_replies_stay_short(source, queue,
                                                                           monkeypatch):
    kernel, write_end = queue
    # in-process every listing is taken anew (no watcher), so each entry is built: a step
    # is READDIR_NEW_MAX entries (names the kernel holds go READDIR_STEP a step: the real
    # mount's test in test_fs_isolation.py)
    step = READDIR_NEW_MAX

    async def scenario(ops):
        ops.kernel_queue = kernel
        ino = (await lookup_path(ops, "big")).st_ino
        os.write(write_end, b"x")  # a request waits in the "kernel"
        monkeypatch.setattr(workers, "CONTENDED_SECONDS", 3600.0)
        seen: list[int] = []
        token = await one_reply(ops, ino, seen)
        # one step (and . and ..), then the waiting request ran, then the reply ended
        assert len(token) == step + 2
        assert kernel.yields == 1 and seen and seen[0] == step + 2
        os.read(kernel._fd, 1)  # nothing waits now, but something did a moment ago
        assert len(await one_reply(ops, ino)) == step + 2
        monkeypatch.setattr(workers, "CONTENDED_SECONDS", 0.0)  # ... long ago
        assert len(await one_reply(ops, ino)) == ENTRIES + 2
    run(source, scenario)


def test_the_kernel_queue_is_looked_at_with_poll(queue):
    kernel, write_end = queue
    assert not kernel.waiting()
    os.write(write_end, b"x")
    assert kernel.waiting()
    os.read(kernel._fd, 1)
    assert not kernel.waiting()
    assert KernelQueue(-1).waiting() is False  # no FUSE session: nothing ever waits


@pytest.mark.skipif(not os.access("/dev/fuse", os.R_OK | os.W_OK), reason="needs /dev/fuse")
def test_the_fuse_fd_is_found_and_an_unmounted_one_never_waits():
    before = KernelQueue.find_fuse_fd()
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        found = KernelQueue.find_fuse_fd()
        assert found == (fd if before < 0 else before)
        assert os.readlink(f"/proc/self/fd/{found}") == "/dev/fuse"
        assert KernelQueue(fd).waiting() is False  # not mounted: poll says POLLERR, not POLLIN
    finally:
        os.close(fd)
