"""The sans-I/O core every process shares (client, broker, worker): the protocol and the
wire, the op table, errors, flow control, configuration, addresses, security, shared-memory
segments and copies. Rule: nothing here imports from another fabric subpackage.
"""
