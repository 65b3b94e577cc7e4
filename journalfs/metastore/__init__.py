"""The gvfs-compatible metadata store: :mod:`.store` (MetaStore, the only writer of a store),
:mod:`.files` (the store directory's files, opened safely; lock and temp-file housekeeping),
:mod:`.backend` (typed write operations and the Protocol every backend serves),
:mod:`.service` (MetaService, its trio face: durability per --sync, background flush and
rotation), :mod:`.location` (which store a mount uses), :mod:`.fsck` (store checks and repair)
:mod:`.gvfsd` (the D-Bus backend that lets the user's gvfsd-metadata do the writing) and
:mod:`.gvfs_service` (one writer per gvfs store: join gvfsd-metadata, or serve its D-Bus
interface as journalfs, or refuse)."""
