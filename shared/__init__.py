"""The contract between Leasehold's two daemons.

`shared` holds what both `controlplane` and `dataplane` must agree on: settings, codes, wire
models, RPC framing, token format, logging and redaction. It imports neither daemon.
"""
