"""``[providers.<name>]`` tables: limits default to the DESIGN 5 table by name (else 60,
60000, 5) and may be set in the table; the key comes from the named variable, never shows in
a repr, and is masked by the log formatter; mistakes name the table or variable."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from gateway.cli import _secret_values
from gateway.config import ConfigError, Settings
from gateway.logging_setup import RedactSecrets
from gateway.providers.config import provider_checks, provider_configs
from gateway.ratelimit.limits import ProviderLimits

ENV = {"GROQ_KEY": "gsk-secret-groq-key", "OTHER_KEY": "sk-other-secret"}


def test_limits_come_from_the_table_by_name_else_the_defaults() -> None:
    found = provider_configs(Settings(sections={
        "providers": {"groq": {"base_url": "https://api.groq.com/openai/v1",
                               "api_key_env": "GROQ_KEY"},
                      "local": {"base_url": "http://127.0.0.1:11434/v1/"},
                      "mine": {"base_url": "https://x/v1", "concurrent": 2,
                               "window_seconds": 0.5}},
        "ratelimit": {"providers": {"mine": {"concurrent": 9, "requests_per_minute": 7}}}}),
        ENV)
    assert found["groq"].limits == ProviderLimits(30, 30_000, 3)
    assert found["local"].limits == ProviderLimits(60, 60_000, 5)
    assert found["local"].base_url == "http://127.0.0.1:11434/v1" and found["local"].api_key is None
    # [providers.mine] wins over [ratelimit.providers.mine]; what it leaves out stays.
    assert found["mine"].limits == ProviderLimits(7, 60_000, 2, window_seconds=0.5)
    assert found["groq"].api_key is not None and found["groq"].api_key.get() == ENV["GROQ_KEY"]
    assert ENV["GROQ_KEY"] not in repr(found) and ENV["GROQ_KEY"] not in str(found)


@pytest.mark.parametrize(("table", "variable"), [
    ({"base_url": "https://x/v1", "api_key_env": "MISSING_KEY"}, "MISSING_KEY"),
    ({"base_url": "ftp://x"}, "[providers.p].base_url"),
    ({}, "[providers.p].base_url"),
    ({"base_url": "https://x/v1", "api": "anthropic"}, "[providers.p].api"),
    ({"base_url": "https://x/v1", "timeout_seconds": 0}, "[providers.p].timeout_seconds"),
    ({"base_url": "https://x/v1", "concurrent": 1.5}, "[providers.p].concurrent"),
    ({"base_url": "https://x/v1", "retries_on_429": -1}, "[providers.p].retries_on_429"),
])
def test_mistakes_name_the_table_or_variable(table: dict[str, object], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        provider_configs(Settings(sections={"providers": {"p": table}}), ENV)
    assert info.value.variable == variable


def test_the_log_formatter_masks_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTHER_KEY", ENV["OTHER_KEY"])
    settings = dataclasses.replace(Settings(), sections={"providers": {
        "o": {"base_url": "https://x/v1", "api_key_env": "OTHER_KEY"}}})
    assert ENV["OTHER_KEY"] in _secret_values(settings)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "sent %s", (ENV["OTHER_KEY"],),
                               None)
    RedactSecrets(_secret_values(settings)).filter(record)
    assert ENV["OTHER_KEY"] not in record.getMessage()


def test_doctor_lines_for_providers() -> None:
    settings = Settings(sections={"providers": {
        "groq": {"base_url": "https://api.groq.com/openai/v1", "api_key_env": "GROQ_KEY"}}})
    [line] = [c.line() for c in provider_checks(settings, ENV)]
    assert line.startswith("ok") and "providers.groq" in line and "GROQ_KEY" in line
    assert "30 requests and 30000 tokens per 60 s, 3 at once" in line
    assert ENV["GROQ_KEY"] not in line
    [check] = provider_checks(settings, {})
    assert check.status == "fail" and "GROQ_KEY" in check.line()
    assert provider_checks(Settings(), {}) == []
