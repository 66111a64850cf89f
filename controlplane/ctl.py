"""leaseholdctl: placeholder, filled below."""
def cli() -> None:
    raise SystemExit("not yet")
