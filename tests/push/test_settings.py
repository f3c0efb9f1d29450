"""The ``[push]`` TOML table: defaults, overrides, and errors that name the setting."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, Settings
from gateway.push.settings import PushSettings


def test_defaults_and_overrides() -> None:
    assert PushSettings.from_settings(Settings()) == PushSettings()
    config = PushSettings.from_settings(Settings(sections={"push": {
        "retention_days": 7, "client_buffer_rows": "50", "heartbeat_seconds": 2.5}}))
    assert (config.retention_days, config.client_buffer_rows, config.heartbeat_seconds) == (
        7.0, 50, 2.5)


@pytest.mark.parametrize(("table", "variable"), [
    ({"retention_dayz": 1}, "[push].retention_dayz"),
    ({"client_buffer_rows": "many"}, "[push].client_buffer_rows"),
    ({"poll_seconds": 0}, "[push].poll_seconds"),
])
def test_bad_values_name_the_setting(table: dict[str, object], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PushSettings.from_settings(Settings(sections={"push": table}))
    assert caught.value.variable == variable
