"""Index jobs of the views: each journal indexed once in a worker thread of its own (one per
owner at a time, within a CPU budget per owner), loaded from or saved to the store's index
directory, extended when it grows; records decoded in batches and remembered in the catalog;
records.jsonl measured."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
from typing import Callable

import trio

from ..journals import RecordIndex
from .indexfiles import matches, may_extend
from .jsonlview import JsonlLayout
from .viewbase import ViewsBase
from .viewnodes import LIVE, IndexJob, JournalInfo, VNode

log = logging.getLogger("journalfs.fs.views")

#: Records decoded together for single-record requests; batches with more payload bytes
#: than this are not remembered.
RECORD_BATCH = 256
#: ... for a format that cannot resume mid-file (a gvfs tree, walked from its top for every
#: batch): more records a walk, so that `ls -l` of a big one walks it tens of times, not
#: thousands (its records have no payload: a batch costs ~400 bytes a record).
UNRESUMABLE_RECORD_BATCH = 1 << 14
BATCH_PAYLOAD_LIMIT = 1 << 20
#: Journals up to this size are indexed and measured (records.jsonl's size) when first stat'ed;
#: bigger ones show records.jsonl with size 0 until it was read once (direct I/O, as /proc).
SMALL_JOURNAL_BYTES = 4 << 20
SMALL_JOURNAL_RECORDS = 50_000
#: Journals from this size on get their index saved in the store directory.
DISK_INDEX_MIN_BYTES = 1 << 20
#: Damaged journals listed in status.json at most.
DAMAGE_LIST_MAX = 1000


def record_batch(idx: RecordIndex) -> int:
    """Records decoded together with one a request asks for."""
    return RECORD_BATCH if idx.codec.resumable else UNRESUMABLE_RECORD_BATCH


class ViewIndexes(ViewsBase):
    """Indexes of journals, decoded records and records.jsonl layouts."""

    async def _index(self, rel: bytes, seq: int | None = None) -> RecordIndex:
        """The journal's index: complete, or (``seq`` given) one that already covers record
        ``seq``, possibly still growing. Waits only for this journal's own indexing."""
        info = self._trusted_info(rel)
        if info is not None and info.index is not None:
            return info.index
        job = self._jobs.get(rel)
        if job is None:
            job = self._jobs[rel] = IndexJob()
            trio.lowlevel.spawn_system_task(self._run_job, rel, job)
        while not job.done.is_set():
            partial = job.partial
            if seq is not None and partial is not None and seq < partial.count:
                return partial
            if seq is None:
                await job.done.wait()
            else:
                with trio.move_on_after(0.02):
                    await job.done.wait()
        if job.error is not None:
            raise OSError(job.error.errno or errno.EIO, job.error.strerror or "not a journal")
        if job.result is None:  # a job ends with its error or its result
            raise OSError(errno.EIO, "indexing ended without an index")
        return job.result

    @contextlib.asynccontextmanager
    async def _indexing_turn(self, rel: bytes):
        """A turn for work that reads a whole journal (indexing, measuring records.jsonl):
        one at a time per journal owner, at most INDEX_THREADS at once; the thread it runs
        in takes :attr:`_index_limiter`."""
        info = self.catalog.get(("journal", rel))
        owner = info.uid if info is not None else -1
        limiter = self._owner_limiters.get(owner)
        if limiter is None:
            limiter = self._owner_limiters[owner] = trio.CapacityLimiter(1)
        try:
            async with limiter:
                yield
        finally:
            stats = limiter.statistics()
            if not stats.borrowed_tokens and not stats.tasks_waiting:
                self._owner_limiters.pop(owner, None)

    async def _run_job(self, rel: bytes, job: IndexJob) -> None:
        try:
            async with self._indexing_turn(rel):
                job.result = await trio.to_thread.run_sync(
                    self._build_index, rel, job, limiter=self._index_limiter,
                    abandon_on_cancel=True)
        except OSError as exc:
            job.error = exc
        except Exception:  # noqa: BLE001 -- a system task must never end the mount
            log.exception("indexing %r failed", rel)
            job.error = OSError(errno.EIO, "indexing failed")
        finally:
            if self._jobs.get(rel) is job:
                del self._jobs[rel]
            job.done.set()

    def _measure_soon(self, rel: bytes) -> None:
        """Measure a big journal's records.jsonl in the background (every line rendered once,
        never kept), so that its size shows without a reader reading it all first: `tail -f`
        then starts at its last lines. The layout is saved with the on-disk index, so this
        happens once per journal; growth later extends it by the new records only."""
        if rel in self._measuring or rel == LIVE:
            return
        self._measuring.add(rel)
        trio.lowlevel.spawn_system_task(self._measure, rel)

    async def _measure(self, rel: bytes) -> None:
        try:
            idx = await self._index(rel)
            async with self._indexing_turn(rel):
                await trio.to_thread.run_sync(self._measure_layout, rel, idx,
                                              limiter=self._index_limiter,
                                              abandon_on_cancel=True)
        except OSError:  # gone or no longer a journal: nothing to measure
            pass
        except Exception:  # noqa: BLE001 -- a system task must never end the mount
            log.exception("measuring records.jsonl of %r failed", rel)
        finally:
            self._measuring.discard(rel)

    def _measure_layout(self, rel: bytes, idx: RecordIndex) -> None:
        if not idx.codec.resumable:  # rendered only whole (a gvfs tree): left to a reader
            return
        info = self.catalog.get(("journal", rel))
        if info is None or info.index is not idx or self._known_layout(info) is not None:
            return  # changed meanwhile (its next getattr starts again), or already known
        charge = self.index_cpu.meter(info.uid)
        self._layout_done(rel, idx)(JsonlLayout(idx))
        # charged after the fact (one pass, no steps to pause between): the pause holds the
        # owner's indexing turn, so his next index work waits for his budget
        charge()

    def _build_index(self, rel: bytes, job: IndexJob) -> RecordIndex:
        """Index a journal (worker thread): from memory, the store's index directory, or the
        file itself (only its growth when an earlier index still holds)."""
        info = self._journal_info(rel)
        codec = info.codec if info is not None else None
        if info is None or codec is None:
            raise FileNotFoundError(errno.ENOENT, "not a journal")
        if info.index is not None and rel != LIVE and info.index.identity == info.ident[1:] \
                and info.index.dev == info.ident[0]:
            return info.index
        dev, ino, size, _ = info.ident
        path = self._display_path(rel)
        opener = self._opener(rel, dev, ino)
        previous = info.previous if rel != LIVE else None
        if rel != LIVE:
            loaded = self.index_dir.load(dev, ino, path)
            if loaded is not None:
                saved, header, saved_layout = loaded
                saved.opener = opener
                if matches(header, codec.name, size, info.ident[3], info.head):
                    if saved_layout is not None:
                        info.layout = JsonlLayout.saved(saved, *saved_layout)
                    self._adopt(rel, info, saved)
                    self._count(indexes_loaded=1)
                    return saved
                if may_extend(header, codec.name, size, info.head) \
                        and (previous is None or previous.count < saved.count):
                    previous = saved

        charge = self.index_cpu.meter(info.uid)

        def progress(partial: RecordIndex) -> None:
            job.partial = partial
            charge()  # between batches (<= 1 MiB each): may pause this owner's indexing

        index = RecordIndex.build(path, codec, previous=previous, opener=opener,
                                  progress=progress)
        charge()
        if index.identity != info.ident[1:]:  # changed while indexed: describe what was read
            info = self._journal_info(rel) or info
        if info.layout is not None and not info.layout.fits(index):
            prior = info.layout
            info.layout = None
            if prior.size is not None and index.grown_from is not None \
                    and index.count - index.grown_from[1] <= SMALL_JOURNAL_RECORDS:
                info.layout = JsonlLayout(index, prior)
        self._adopt(rel, info, index)
        resumed = index.grown_from[1] if index.grown_from else 0
        self._count(records_indexed=index.count - resumed,
                    **{"indexes_extended" if index.grown_from else "indexes_built": 1})
        if rel != LIVE and index.identity[1] >= DISK_INDEX_MIN_BYTES:
            self._save(rel, info, index)
        return index

    def _count(self, **increments: int) -> None:
        with self._ids_lock:
            for name, n in increments.items():
                self.counters[name] += n

    def _adopt(self, rel: bytes, info: JournalInfo, index: RecordIndex) -> None:
        info.index, info.previous = index, None
        finished = index.finished_layout  # set by _layout_done: a JsonlLayout
        if isinstance(finished, JsonlLayout) and finished.fits(index):
            info.layout = finished
        if info.layout is not None and not info.layout.fits(index):
            info.layout = None
        self.catalog.put(("journal", rel), info, info.cost(), info.uid)
        self._note_damage(rel, index)

    def _save(self, rel: bytes, info: JournalInfo, index: RecordIndex) -> None:
        layout = info.layout
        saved_layout = None
        if layout is not None and layout.size is not None and layout.fits(index):
            saved_layout = (list(layout.seqs), list(layout.offsets), layout.size)
        if self.index_dir.save(index, info.head, saved_layout, owner=info.uid,
                               rel=os.fsdecode(rel)):
            self._count(indexes_saved=1)

    def _note_damage(self, rel: bytes, index: RecordIndex) -> None:
        err = index.error
        if err is None:
            self.damaged.pop(rel, None)
            return
        entry = (int(err.offset), str(err.reason))
        if self.damaged.get(rel) != entry:
            log.warning("damaged journal %s at byte %d: %s (the records before are shown)",
                        self._display_path(rel), *entry)
            if len(self.damaged) >= DAMAGE_LIST_MAX:
                self.damaged.pop(next(iter(self.damaged)))
            self.damaged[rel] = entry

    def _record(self, rel: bytes, seq: int, idx: RecordIndex) -> dict:
        """Record ``seq`` of a journal, decoded with its neighbours: ``ls -l`` or ``cat *``
        over a journal directory then decodes each record about once, not once per call."""
        size = record_batch(idx)
        first = seq - seq % size
        key = self._batch_key(rel, idx, first)
        batch = self.catalog.get(key)
        if batch is None:
            batch = list(idx.records(first, size))
            payload = sum(len(r.get("payload") or b"") for r in batch)
            whole = len(batch) == size or idx.complete
            if whole and payload <= BATCH_PAYLOAD_LIMIT:
                info = self.catalog.get(("journal", rel))  # charged to the journal's owner
                self.catalog.put(key, batch, payload + 400 * len(batch),
                                 info.uid if info is not None else None)
        if not 0 <= seq - first < len(batch):
            raise FileNotFoundError(errno.ENOENT, "no such record")
        return batch[seq - first]

    @staticmethod
    def _batch_key(rel: bytes, idx: RecordIndex, first: int) -> tuple:
        # The live journal is written in place: its identity alone does not tell versions.
        return ("batch", rel, idx.dev, idx.identity, first, idx.count if rel == LIVE else None)

    def _cached_record(self, node: VNode) -> tuple[dict, JournalInfo] | None:
        info = self._trusted_info(node.rel)
        if info is None or info.index is None:
            return None
        first = node.seq - node.seq % record_batch(info.index)
        batch = self.catalog.get(self._batch_key(node.rel, info.index, first))
        if batch is None or not 0 <= node.seq - first < len(batch):
            return None
        return batch[node.seq - first], info

    def _known_layout(self, info: JournalInfo) -> JsonlLayout | None:
        layout, idx = info.layout, info.index
        if layout is None or idx is None or layout.size is None or not layout.fits(idx):
            return None
        return layout

    def _full_layout(self, rel: bytes, idx: RecordIndex) -> JsonlLayout:
        """records.jsonl's layout, measured now when not known (thread; small journals)."""
        info = self.catalog.get(("journal", rel))
        if info is not None and info.layout is not None and info.layout.fits(idx) \
                and info.layout.size is not None:
            return info.layout
        layout = JsonlLayout(idx)
        if info is not None and info.index is idx:
            info.layout = layout
            self.catalog.put(("journal", rel), info, info.cost(), info.uid)
        return layout

    def _layout_done(self, rel: bytes, idx: RecordIndex) -> Callable[[JsonlLayout], None]:
        def done(layout: JsonlLayout) -> None:
            info = self.catalog.get(("journal", rel))
            if info is None or info.index is not idx:
                # read to the end the moment its indexing ended, before the index was
                # adopted: _adopt takes the layout along
                idx.finished_layout = layout
                return
            info.layout = layout
            self.catalog.put(("journal", rel), info, info.cost(), info.uid)
            if rel != LIVE and idx.identity[1] >= DISK_INDEX_MIN_BYTES:
                self._save(rel, info, idx)
        return done
