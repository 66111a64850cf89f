"""The per-attempt wire Structs are untracked by the collector (`gc=False`), which is only safe
while none of them can hold a container: every field must be a scalar or another untracked
Struct. A field that could hold a list, a dict or an arbitrary object fails here."""

from __future__ import annotations

import gc

import msgspec
import pytest

from shared.wire import Ack, AttemptFinished, AttemptRow, AttemptStarted, RateLimit, RateLimits, Usage
from tests.support import rows

UNTRACKED = (Usage, RateLimit, RateLimits, AttemptRow, AttemptStarted, AttemptFinished, Ack)
SCALARS = (
    msgspec.inspect.StrType,
    msgspec.inspect.IntType,
    msgspec.inspect.FloatType,
    msgspec.inspect.BoolType,
    msgspec.inspect.NoneType,
)


def _acyclic(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, SCALARS):
        return True
    if isinstance(info, msgspec.inspect.UnionType):
        return all(_acyclic(member) for member in info.types)
    if isinstance(info, msgspec.inspect.StructType):
        return info.cls in UNTRACKED
    return False


@pytest.mark.parametrize("cls", UNTRACKED, ids=lambda cls: cls.__name__)
def test_every_field_is_a_scalar_or_an_untracked_struct(cls: type) -> None:
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    assert info.cls.__struct_config__.gc is False
    bad = [field.name for field in info.fields if not _acyclic(field.type)]
    assert bad == []


def test_a_row_with_every_part_is_not_tracked() -> None:
    row = msgspec.structs.replace(
        rows.row("2026-12-02T00:00:00.000Z"),
        rate_limits=RateLimits(observed_at="t", requests=RateLimit(limit=1, remaining=1, reset_at=None)),
    )
    frame = AttemptFinished(req_id=1, row=row)
    assert row.usage is not None and row.rate_limits is not None
    assert not any(gc.is_tracked(obj) for obj in (row, row.usage, row.rate_limits, frame))
