"""``[providers.<name>]`` tables: where a provider is, which environment variable holds its
key, its limits and timeouts. Example::

    [providers.groq]
    api = "openai"                                  # the only API spoken (OpenAI-compatible)
    base_url = "https://api.groq.com/openai/v1"
    api_key_env = "GROQ_API_KEY"                    # the variable's name, never the key
    requests_per_minute = 30                        # defaults: the DESIGN 5 table by name,
    tokens_per_minute = 30000                       # else 60, 60000, 5
    concurrent = 3
    timeout_seconds = 60                            # a whole call; a stream: between chunks
    connect_timeout_seconds = 5
    max_retry_after_seconds = 30                    # a longer Retry-After moves on instead
    retries_on_429 = 3
    max_answer_bytes = 33554432                     # an answer (or a stream) past it fails

The key is read once from the environment into a ``Secret``, which prints as ``***``, so no
repr, log line or error message can show it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ConfigError, Secret, Settings
from gateway.ratelimit.limits import ProviderLimits, provider_limits
from gateway.stores.doctor import Check

APIS = ("openai",)


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    base_url: str
    api_key: Secret | None
    api_key_env: str | None
    limits: ProviderLimits
    api: str = "openai"
    timeout_seconds: float = 60.0
    connect_timeout_seconds: float = 5.0
    max_retry_after_seconds: float = 30.0
    retries_on_429: int = 3
    # A provider gone wrong must not fill the process's memory: an answer, or a stream's
    # bytes, past this fails the attempt (Unavailable: the next provider).
    max_answer_bytes: int = 32 * 1024 * 1024


def _positive(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(where, "must be a positive number")
    return float(value)


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(where, "must be a non-empty string")
    return value


def provider_configs(settings: Settings,
                     environ: Mapping[str, str] | None = None) -> dict[str, ProviderConfig]:
    """Every ``[providers.<name>]`` table, checked; keys read from ``environ`` (os.environ)."""
    env = os.environ if environ is None else environ
    limits = provider_limits(settings)
    configs: dict[str, ProviderConfig] = {}
    for name, spec in settings.section("providers").items():
        where = f"[providers.{name}]"
        if not isinstance(spec, Mapping):
            raise ConfigError(where, "must be a table")
        api = spec.get("api", "openai")
        if api not in APIS:
            raise ConfigError(f"{where}.api", f"must be one of {', '.join(APIS)}")
        base_url = _string(f"{where}.base_url", spec.get("base_url")).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.base_url", "must be an http:// or https:// URL")
        key_env = spec.get("api_key_env")
        key: Secret | None = None
        if key_env is not None:
            key_env = _string(f"{where}.api_key_env", key_env)
            if not env.get(key_env):
                raise ConfigError(key_env, f"is not set (the API key of {where})")
            key = Secret(env[key_env])
        retries = spec.get("retries_on_429", 3)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"{where}.retries_on_429", "must be a whole number >= 0")
        answer_bytes = spec.get("max_answer_bytes", ProviderConfig.max_answer_bytes)
        if isinstance(answer_bytes, bool) or not isinstance(answer_bytes, int) \
                or answer_bytes <= 0:
            raise ConfigError(f"{where}.max_answer_bytes", "must be a positive whole number")
        configs[name] = ProviderConfig(
            name=name, base_url=base_url, api_key=key, api_key_env=key_env,
            limits=limits[name], api=api,
            timeout_seconds=_positive(f"{where}.timeout_seconds",
                                      spec.get("timeout_seconds", 60.0)),
            connect_timeout_seconds=_positive(f"{where}.connect_timeout_seconds",
                                              spec.get("connect_timeout_seconds", 5.0)),
            max_retry_after_seconds=_positive(f"{where}.max_retry_after_seconds",
                                              spec.get("max_retry_after_seconds", 30.0)),
            retries_on_429=retries, max_answer_bytes=answer_bytes)
    return configs


def provider_key_values(settings: Settings, environ: Mapping[str, str] | None = None
                        ) -> list[str]:
    """The API keys the ``[providers.*]`` tables name, for the log formatter to mask (read
    without checking the tables, so a command that calls no provider still starts)."""
    env = os.environ if environ is None else environ
    values = []
    for spec in settings.section("providers").values():
        name = spec.get("api_key_env") if isinstance(spec, Mapping) else None
        if isinstance(name, str) and env.get(name):
            values.append(env[name])
    return values


def provider_checks(settings: Settings, environ: Mapping[str, str] | None = None
                    ) -> list[Check]:
    """``gateway doctor`` lines for the ``[providers.*]`` tables (nothing is sent to them):
    a table that cannot be used (its key's variable unset, a bad value) fails, so ``serve``
    and ``listen`` refuse to start rather than fail at the first call."""
    try:
        configs = provider_configs(settings, environ)
    except ConfigError as exc:
        return [Check("fail", "providers", str(exc))]
    return [Check("ok", f"providers.{name}",
                  f"{c.base_url}, key from {c.api_key_env or '(none)'}, "
                  f"{c.limits.requests_per_minute} requests and {c.limits.tokens_per_minute} "
                  f"tokens per {c.limits.window_seconds:g} s, {c.limits.concurrent} at once")
            for name, c in configs.items()]
