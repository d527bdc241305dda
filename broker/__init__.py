"""The fabric broker: routing loop (``server``) and session registry (``registry``)."""
