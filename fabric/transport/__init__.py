"""How a session's bytes travel: its connection and pending requests, bulk uploads and reads
(shared memory, direct links), and moves of tensors between devices.
"""
