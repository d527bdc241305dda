"""The fabric broker: the routing loop (``server``) and, sans I/O, the session registry
(``registry``) with its rooms: records (``model``), admission checks (``handshake``), session
phases (``sessions``), sessions the broker ends (``endings``), workers and device numbering
(``worker_table``), admin commands (``admin``), flow control (``flow``), held answers
(``held``)."""
