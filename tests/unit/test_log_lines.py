"""The log line's cheap path stays safe: what skips the redactor, what its memo forgets, and
how lines reach the stream (one write per loop iteration, at once outside a loop)."""

from __future__ import annotations

import asyncio
import io
import json
import threading

import pytest

from shared.logging import SAFE_KEYS, configure_logging, get_logger, info_line, register_secret, reset_logging


@pytest.fixture
def out():
    stream = io.StringIO()
    configure_logging("test", "debug", stream=stream)
    yield stream
    reset_logging()


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_request_done_keeps_ids_codes_and_numbers(out) -> None:
    get_logger("t").info(
        "request_done",
        attempt_id="att_01J0000000000000000000000A",
        account_id="legacy-anthropic",
        key_id="01J0000000000000000000000B",
        status="completed",
        http_status=200,
        code=None,
        bytes=12,
        duration_ms=1.5,
    )
    (line,) = lines(out)
    assert line["event"] == "request_done" and line["attempt_id"] == "att_01J0000000000000000000000A"
    assert (
        line["account_id"],
        line["status"],
        line["http_status"],
        line["code"],
        line["bytes"],
        line["duration_ms"],
    ) == ("legacy-anthropic", "completed", 200, None, 12, 1.5)
    assert line["service"] == "test" and line["level"] == "info" and line["timestamp"].endswith("Z")


@pytest.mark.parametrize("key", ["account_id", "key_id", "reason", "url", "error"])
def test_every_key_outside_the_safe_set_is_scanned(out, key: str) -> None:
    assert key not in SAFE_KEYS
    get_logger("t").warning("x", **{key: "Bearer abcdefgh12345678"})
    assert lines(out)[0][key] == "Bearer [redacted]"


def test_a_secret_registered_later_is_scrubbed_from_a_value_seen_before(out) -> None:
    value = "later-registered-value-" + "k" * 12
    log = get_logger("t")
    log.info("first", detail=value)
    register_secret(value)
    log.info("second", detail=value)
    first, second = lines(out)
    assert first["detail"] == value  # not a secret yet: logged as it was
    assert second["detail"] == "[redacted]"


def test_values_msgspec_cannot_encode_are_logged_redacted(out) -> None:
    class Leaky:
        def __repr__(self) -> str:
            return "Leaky(x-api-key: q1w2e3r4t5y6u7i8)"

    get_logger("t").info("odd", thing=Leaky(), pair=("a", "sk-ant-api03-" + "Z" * 20))
    line = lines(out)[0]
    assert "q1w2e3r4t5y6u7i8" not in line["thing"] and "[redacted]" in line["thing"]
    assert line["pair"] == ["a", "[redacted]"]


def test_inside_a_loop_lines_are_written_together_after_the_iteration(out) -> None:
    async def scenario() -> tuple[str, str]:
        log = get_logger("t")
        for n in range(3):
            log.info("burst", n=n)
        before = out.getvalue()
        loop = asyncio.get_running_loop()
        turned = loop.create_future()
        loop.call_soon(turned.set_result, None)  # runs after the flush queued before it
        await turned
        return before, out.getvalue()

    before, after = asyncio.run(scenario())
    assert before == ""
    assert [line["n"] for line in lines(out)] == [0, 1, 2]
    assert after == out.getvalue()


def test_a_thread_without_a_loop_writes_at_once(out) -> None:
    worker = threading.Thread(target=lambda: get_logger("t").info("from_thread"))
    worker.start()
    worker.join(10)
    assert [line["event"] for line in lines(out)] == ["from_thread"]


REQUEST_DONE = {
    "attempt_id": "att_01J0000000000000000000000A",
    "account_id": "legacy-anthropic",
    "key_id": "01J0000000000000000000000B",
    "status": "failed",
    "http_status": 529,
    "code": "upstream_overloaded",
    "bytes": 12,
    "duration_ms": 1.5,
}


def _without_time(line: str) -> tuple[str, str]:
    head, _, tail = line.partition('"timestamp":')
    return head, tail.split('"', 2)[2]


def test_info_line_writes_the_bound_loggers_line_byte_for_byte(out) -> None:
    get_logger("dataplane").info("request_done", **REQUEST_DONE)
    info_line("dataplane", "request_done", **REQUEST_DONE)
    first, second = out.getvalue().splitlines()
    assert _without_time(first) == _without_time(second)
    assert list(json.loads(second)) == [*REQUEST_DONE, "event", "service", "level", "timestamp"]


def test_info_line_is_redacted_like_any_line(out) -> None:
    register_secret("sk-ant-api03-" + "Q" * 40)
    info_line("dataplane", "request_done", **{**REQUEST_DONE, "account_id": "sk-ant-api03-" + "Q" * 40})
    assert lines(out)[0]["account_id"] == "[redacted]"
    assert "QQQQQQ" not in out.getvalue()


def test_info_line_keeps_the_configured_level() -> None:
    stream = io.StringIO()
    configure_logging("test", "warning", stream=stream)
    try:
        info_line("dataplane", "request_done", **REQUEST_DONE)
        get_logger("t").warning("kept")
    finally:
        reset_logging()
    assert [line["event"] for line in lines(stream)] == ["kept"]


def test_info_line_before_configuration_is_structlogs(capsys) -> None:
    reset_logging()
    info_line("dataplane", "request_done", **REQUEST_DONE)
    assert "request_done" in capsys.readouterr().out
