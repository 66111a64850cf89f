"""Hostile input (SPEC §19): what a worker may send, tried as a hostile worker would."""
