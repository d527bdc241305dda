"""Sessions (a stream of ops and reads on one device) and the admin client.
"""

from fabric import array_api  # noqa: F401  (a session's tensors' t.__array_namespace__())
