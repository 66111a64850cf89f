"""The supervisor of the fleet's Redis loops (SPEC §19): states by table; a loop that raises is
logged and started again; one that keeps failing makes the host unhealthy until a run lasts."""

from __future__ import annotations

import asyncio

import pytest

from shared.supervisor import LoopState, Supervisor, loop_state, reported
from shared.wire import FleetLoops, LoopReport, Message
from tests.support.waits import until

STATES = [
    (0, 0.0, LoopState.RUNNING),
    (1, 0.1, LoopState.RESTARTING),
    (2, 4.9, LoopState.RESTARTING),
    (3, 0.1, LoopState.FAILING),
    (9, 4.9, LoopState.FAILING),
    (9, 5.0, LoopState.RUNNING),
    (1, 5.0, LoopState.RUNNING),
]


@pytest.mark.parametrize("failures,running_for_s,expected", STATES)
def test_loop_state(failures: int, running_for_s: float, expected: LoopState) -> None:
    assert loop_state(failures, running_for_s, failing_after=3, steady_s=5.0) is expected


@pytest.mark.parametrize("failing_after", [1, 3])
async def test_failing_and_healthy_read_every_loops_state(failing_after: int) -> None:
    """`failing`/`healthy` skip the state of a loop short of `failing_after` failures (a compare per
    loop, per mint and per ceilinged request): they answer what every loop's state says."""
    now = [100.0]
    supervisor = Supervisor(failing_after=failing_after, steady_s=5.0, clock=lambda: now[0])

    async def idle() -> None:
        await asyncio.sleep(3600)

    cases = [(f, r) for f in range(6) for r in (0.0, 0.1, 4.9, 5.0, 60.0)]
    tasks = [supervisor.spawn(f"loop-{i}", idle) for i in range(len(cases))]
    try:
        for i, (failures, running_for_s) in enumerate(cases):
            loop = supervisor._loops[f"loop-{i}"]
            loop.failures, loop.started = failures, now[0] - running_for_s
        expected = sorted(
            f"loop-{i}"
            for i, (failures, running_for_s) in enumerate(cases)
            if loop_state(failures, running_for_s, failing_after=failing_after, steady_s=5.0) is LoopState.FAILING
        )
        assert expected and supervisor.failing() == expected and not supervisor.healthy()
        now[0] += 5.0  # every run has lasted: none fails
        assert supervisor.failing() == [] and supervisor.healthy()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_failing_loop_restarts_then_reads_failing_then_recovers() -> None:
    supervisor = Supervisor(pause_s=0.01, failing_after=3, steady_s=0.5)
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) <= 4:
            raise KeyError(b"from_host")  # what a malformed revoke entry used to raise
        await asyncio.sleep(3600)

    async def steady() -> None:
        await asyncio.sleep(3600)

    tasks = [supervisor.spawn("flaky", flaky), supervisor.spawn("steady", steady)]
    try:
        await until(lambda: len(runs) >= 3 and not supervisor.healthy(), 5, "three failures in a row: failing")
        status = {s.name: s for s in supervisor.statuses()}
        assert status["flaky"].last_error_kind == "KeyError" and status["steady"].state is LoopState.RUNNING
        assert supervisor.failing() == ["flaky"]
        await until(lambda: len(runs) == 5, 5, "started again after each failure")
        assert supervisor.restarts == {"flaky": 4, "steady": 0}  # the metric's counter
        await until(supervisor.healthy, 5, "a run that lasted clears it")
        assert {s.name: s.state for s in supervisor.statuses()} == {
            "flaky": LoopState.RUNNING,
            "steady": LoopState.RUNNING,
        }
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(task.cancelled() for task in tasks)


def test_the_data_planes_loops_cross_the_rpc_and_read_as_this_hosts_view_names_them() -> None:
    """`FleetLoops` round-trips in the RPC union; control lists them as `dataplane:<name>`, and a
    state it does not know reads `failing` (never `running` by default)."""
    import msgspec

    sent = FleetLoops(
        loops=[
            LoopReport(name="standing", state="failing", failures=3, restarts=7, last_error_kind="RuntimeError"),
            LoopReport(name="upkeep", state="dozing", failures=0, restarts=0),
        ]
    )
    got = msgspec.msgpack.decode(msgspec.msgpack.encode(sent), type=Message)
    assert got == sent
    assert isinstance(got, FleetLoops)
    statuses = reported(got.loops, "dataplane:")
    assert [(s.name, s.state, s.restarts) for s in statuses] == [
        ("dataplane:standing", LoopState.FAILING, 7),
        ("dataplane:upkeep", LoopState.FAILING, 0),
    ]
