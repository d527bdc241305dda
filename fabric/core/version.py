"""The release of fabric this process runs; broker and workers compare theirs at registration."""

__version__ = "0.1.0"
