"""Fleet mode's shared state in Redis (SPEC §16): the backends behind the interfaces.

Each module implements one interface of the in-process state (`shared/capacity.py`'s
`CapacityStore`, `shared/chainfile.py`'s `ChainStorage`) or one fleet primitive (the host
registry), over one key layout (`keys.py`) and one connection factory (`redis_client.py`, which
turns every Redis failure into `StateUnavailable`). Control-only backends (circuits, decisions,
event fan-out, fleet-wide revocation) live in `controlplane/fleet/`. Nothing secret is written
to Redis: ids (key, account, host, decision, attempt) and the chains' records, never a
credential, a token or a token's digest.
"""
