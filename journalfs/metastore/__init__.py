"""The gvfs-compatible metadata store: :mod:`.store` (MetaStore, the only writer of a store),
:mod:`.service` (MetaService, its trio face with group commit and background rotation),
:mod:`.location` (which store a mount uses), :mod:`.fsck` (store checks and repair),
:mod:`.gvfsd` (the D-Bus backend that lets the user's gvfsd-metadata do the writing) and
:mod:`.gvfs_service` (one writer per gvfs store: join gvfsd-metadata, or serve its D-Bus
interface as journalfs, or refuse)."""
