"""The fake Bot API's own promises that the Telegram tests lean on."""

from __future__ import annotations

from tests.fakes.telegram_server import FakeTelegramServer


def test_wait_until_sees_a_condition_no_api_call_announces() -> None:
    # An inbox row or a file changes without a Bot API call: the wait must look again by itself, not sit out its
    # bound (it did, 60 s at a time, when the last call came before the row).
    looks = iter([False, False, True])
    with FakeTelegramServer() as telegram:
        telegram.wait_until(lambda: next(looks), timeout=60)
    assert next(looks, "none left") == "none left"
