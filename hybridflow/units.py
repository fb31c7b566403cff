"""Units stated once: bytes per GiB (every memory figure in a config, a plan or a report is in GiB)."""

GIB = 2**30
