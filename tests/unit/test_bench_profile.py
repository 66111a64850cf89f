"""bench.profile folds py-spy's collapsed stacks into self and inclusive shares per function."""

from __future__ import annotations

from bench.profile import fold, top

RAW = """\
process 1:"python -m dataplane.main";thread (0x1);run (uvloop/__init__.py:105);handle (dataplane/proxy.py:90);write (asyncio/streams.py:332) 6
process 1:"python -m dataplane.main";thread (0x1);run (uvloop/__init__.py:105);handle (dataplane/proxy.py:95);finish (dataplane/attempt.py:70) 3
process 1:"python -m dataplane.main";thread (0x1);run (uvloop/__init__.py:105) 1
not a stack line
"""


def test_fold_counts_self_and_inclusive_per_function_not_per_line() -> None:
    own, inclusive, total = fold(RAW)
    assert total == 10
    assert own["write (asyncio/streams.py)"] == 6 and own["finish (dataplane/attempt.py)"] == 3
    assert inclusive["handle (dataplane/proxy.py)"] == 9  # two lines of one function, counted once each
    assert inclusive["run (uvloop/__init__.py)"] == 10
    assert not any(k.startswith(("process ", "thread ")) for k in inclusive)
    assert top(own, total, 1) == [("write (asyncio/streams.py)", 60.0)]
