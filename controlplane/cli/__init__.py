"""`leaseholdctl`'s commands, one module per group; `controlplane/ctl.py` is the entry.

The CLI is a client of the control HTTP API and nothing else: it imports `shared` (codes, the
env scrub, ULIDs) and never `dataplane` nor the control daemon's own modules. Pure pieces
(argument checks, request bodies, tables, the SSE parser, the worker environment) are plain
functions the unit tests walk; the shells do one HTTP exchange or one child process.
"""
