"""The control daemon's files: ledger, key journal (and later the admin and policy chains)."""
