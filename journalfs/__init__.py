"""journalfs: journal files as browsable records, gvfs-compatible metadata as xattrs."""
__version__ = "0.1.0"
