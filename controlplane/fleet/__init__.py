"""Fleet mode's control-only backends in Redis (SPEC §16): circuits, decisions, event fan-out
and fleet-wide revocation. The shared ones (capacity, hosts, chains) are in `shared/fleet/`."""
