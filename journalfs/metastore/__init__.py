"""The gvfs-compatible metadata store: :mod:`.store` (MetaStore, the only writer of a store),
:mod:`.service` (MetaService, its trio face with group commit and background rotation),
:mod:`.location` (which store a mount uses), :mod:`.fsck` (store checks and repair) and
:mod:`.gvfsd` (the D-Bus backend that lets the user's gvfsd-metadata do the writing)."""
