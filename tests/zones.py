"""Homes with a known timezone: onboarding writes "local" (the machine's zone), and no test may depend on that."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from picoclaw.onboard import Configure, OnboardStep, onboard

SHANGHAI = "Asia/Shanghai"  # UTC+8 all year, no daylight saving time: the zone most tests' dates are written for


def in_zone(name: str) -> Configure:
    """An `onboard(configure=…)` that writes `name` as config.json's timezone."""
    def configure(data: dict[str, Any]) -> dict[str, Any]:
        data["timezone"] = name
        return data

    return configure


def onboard_in_shanghai(home: Path) -> list[OnboardStep]:
    """`onboard(home)` with "timezone": "Asia/Shanghai" in config.json, as the tests' dates expect."""
    return onboard(home, configure=in_zone(SHANGHAI))
