"""The fabric worker process (``worker``), its per-device executor and backends."""
