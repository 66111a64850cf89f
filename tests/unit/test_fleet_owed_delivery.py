"""Owed writes are delivered in bounded batches (found by the fleet soak with its hostile writer
on a loaded machine): a delivery that kept taking the writes owed meanwhile never returned while
rows arrived, so the loop that also ends the hold after a data loss never got its turn, and the
host stayed `unavailable` for a minute."""

from __future__ import annotations

from controlplane.fleet.owed import Owed, OwedWrites


async def test_a_delivery_takes_what_was_owed_when_it_started_in_order() -> None:
    owed = OwedWrites(is_live=lambda _key: False)
    landed: list[int] = []

    def write(n: int) -> Owed:
        async def land() -> None:
            landed.append(n)
            if n < 1_000:  # each write lets a new one be owed meanwhile
                owed._append(write(n + 100))

        return Owed("evidence", land, evidence=True)

    for n in range(3):
        owed._append(write(n))
    assert await owed.deliver() == 3 and landed == [0, 1, 2] and len(owed) == 3
    assert await owed.deliver() == 3 and landed[3:] == [100, 101, 102]
