"""Randomised property: a capacity table never leaks a slot or goes negative, and a holder
takes one slot on one account however often it reserves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.capacity import CapacityTable

HOLDERS = [f"h{i}" for i in range(6)]
ACCOUNTS = ["a", "b"]

capacity_ops = st.lists(
    st.tuples(st.sampled_from(["reserve", "release"]), st.sampled_from(ACCOUNTS), st.sampled_from(HOLDERS)), max_size=60
)


@given(capacity_ops, st.integers(min_value=1, max_value=4))
def test_capacity_table_never_leaks_or_goes_negative(ops, ceiling) -> None:
    table = CapacityTable()
    held: dict[str, str] = {}  # the model: holder -> account
    for op, account, holder in ops:
        if op == "reserve":
            ok = table.reserve(account, holder, ceiling)
            if holder in held:
                assert ok == (held[holder] == account)  # twice takes one slot; never two accounts
            elif ok:
                held[holder] = account
            else:
                assert sum(1 for a in held.values() if a == account) >= ceiling
        else:
            assert table.release(holder) == (holder in held)
            held.pop(holder, None)
        for acc in ACCOUNTS:
            count = table.count(acc)
            assert count == sum(1 for a in held.values() if a == acc)
            assert 0 <= count <= ceiling
