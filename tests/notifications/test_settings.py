"""``[notifications]``: the retry schedule (the last delay repeats), flags, positive numbers,
and ``gateway dev``'s defaults (a receiver on the same machine), which the table overrides."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.config import ConfigError, Settings
from gateway.notifications.settings import NotificationSettings


def test_defaults_and_the_schedule() -> None:
    settings = NotificationSettings()
    assert settings.retry_seconds == (5, 30, 120, 600, 1800, 3600)
    assert [settings.retry_delay(n) for n in (1, 2, 6, 7, 30)] == [5, 30, 3600, 3600, 3600]
    assert (settings.give_up_after_seconds, settings.disable_after_seconds) == (86400, 432000)
    assert not settings.allow_http and not settings.allow_private_networks
    configured = NotificationSettings.from_section({"retry_seconds": [0.2, 1],
                                                    "allow_http": True})
    assert configured.retry_seconds == (0.2, 1.0) and configured.allow_http


@pytest.mark.parametrize("section", [
    {"retry_seconds": []}, {"retry_seconds": [1, -1]}, {"retry_seconds": "5"},
    {"allow_http": "yes"}, {"poll_seconds": 0}, {"surprise": 1}, {"max_connections": "x"}])
def test_bad_values_are_refused_by_name(section: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as refused:
        NotificationSettings.from_section(section)
    assert "[notifications]" in str(refused.value)


def test_gateway_dev_delivers_to_a_local_receiver_unless_told_not_to() -> None:
    dev = NotificationSettings.from_settings(Settings(dev=True))
    assert dev.allow_http and dev.allow_private_networks
    strict = NotificationSettings.from_settings(dataclasses.replace(
        Settings(dev=True), sections={"notifications": {"allow_private_networks": False}}))
    assert strict.allow_http and not strict.allow_private_networks
    serve = NotificationSettings.from_settings(Settings())
    assert not serve.allow_http and not serve.allow_private_networks
