"""Settings from the environment, optionally layered over a TOML file.

Validation happens once, at start-up: a wrong value raises ``ConfigError`` naming the variable,
and the CLI turns that into one line on stderr. Secret values are wrapped in ``Secret`` so that
they never reach a log line, a repr or an error message by accident.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)
WEBHOOK_SCHEMES = ("standard", "github", "stripe")
# A source name becomes part of item ids (``webhook:<source>:<id>``, read back up to the
# first colon for the documents' owner) and of topics (``docs:src.<source>``): no colon.
WEBHOOK_SOURCE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class ConfigError(ValueError):
    """A configuration value is missing or wrong; ``variable`` names it for the operator."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


class Secret:
    """A string that prints as ``***`` so it cannot leak through logs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class WebhookSource:
    """One configured webhook sender: how its signature is checked, and with which secret."""

    name: str
    scheme: str
    secret: Secret

    def key_bytes(self) -> bytes:
        """The HMAC key: Standard Webhooks secrets are ``whsec_<base64>``, others are raw."""
        raw = self.secret.get()
        if self.scheme == "standard":
            body = raw[len("whsec_") :] if raw.startswith("whsec_") else raw
            return base64.b64decode(body)
        return raw.encode()


@dataclass(frozen=True)
class Settings:
    durable_url: str | None = None
    cache_url: str | None = None
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    admin_token: Secret | None = None
    webhook_sources: Mapping[str, WebhookSource] = field(default_factory=dict)
    telegram_bot_token: Secret | None = None
    telegram_webhook_secret: Secret | None = None
    telegram_api_url: str = "https://api.telegram.org"
    slack_bot_token: Secret | None = None
    slack_signing_secret: Secret | None = None
    slack_api_url: str = "https://slack.com/api/"
    mattermost_url: str | None = None
    mattermost_token: Secret | None = None
    dedup_ttl: int = 86400
    lease_seconds: int = 90
    heartbeat_seconds: int = 30
    reclaim_seconds: int = 60
    max_reclaims: int = 3
    max_failures: int = 3
    listener_lease_seconds: int = 15
    max_body_bytes: int = 1024 * 1024
    # What one document may add to PostgreSQL beside itself: its first chunks (each with a
    # vector) and its first graph edges, in the order of the text.
    max_chunks_per_document: int = 1500
    max_edges_per_document: int = 1000
    # "aof": a write to redis-durable is acknowledged only once WAITAOF confirms it on disk.
    durable_ack: str = "none"
    # How many hash tags the pipeline's and the inboxes' keys spread over (1: the one
    # ``{pipeline}`` / ``{inbox}`` tag): on Redis Cluster, more masters share the queues.
    pipeline_shards: int = 1
    inbox_shards: int = 1
    # Access tokens (JWT): HS256 with the secret, and/or keys of an identity provider's JWKS.
    jwt_secret: Secret | None = None
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    metrics_public: bool = False
    cors_origins: tuple[str, ...] = ()
    # Set by `gateway serve --telegram-polling`, not by the environment.
    telegram_polling: bool = False
    # Set by `gateway dev`, not by the environment: a developer's machine (the brute-force
    # barrier leaves loopback clients alone).
    dev: bool = False
    # Free-form sections of the TOML file (handlers, limits, ...) for the modules that own them.
    sections: Mapping[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.sections.get(name, {})
        return value if isinstance(value, Mapping) else {}


# env variable -> (settings field, parser). Order is the order errors are found in.
def _check_ports(name: str, netloc: str) -> None:
    """Every ``host:port`` of a URL's authority (cluster and sentinel URLs list several) has a
    port of 1-65535: the client libraries would raise a bare ValueError much later."""
    for host in filter(None, netloc.rpartition("@")[2].split(",")):
        if host.endswith("]"):  # [IPv6] without a port
            continue
        _, colon, port = host.rpartition(":")
        if colon and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(name, f"port {port[:20]!r} is not a number 1-65535")


def _parse_redis_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in REDIS_SCHEMES:
        raise ConfigError(name, f"must be a URL with scheme {', '.join(REDIS_SCHEMES)}")
    if parts.scheme in ("unix",) and not parts.path:
        raise ConfigError(name, "unix:// URL needs a socket path")
    _check_ports(name, parts.netloc)
    return value


def _parse_pg_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(name, "must be a postgresql:// URL")
    _check_ports(name, parts.netloc)
    return value


def _parse_http_url(name: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(name, "must be an http:// or https:// URL")
    return value


def _parse_port(name: str, value: str) -> int:
    port = _parse_int(name, value)
    if not 0 <= port <= 65535:
        raise ConfigError(name, "must be a port number 0-65535")
    return port


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(name, f"must be an integer (got {value!r})") from None


def _parse_seconds(name: str, value: str) -> int:
    seconds = _parse_int(name, value)
    if seconds <= 0:
        raise ConfigError(name, f"must be a positive number of seconds (got {seconds})")
    return seconds


def _parse_count(name: str, value: str) -> int:
    count = _parse_int(name, value)
    if count <= 0:
        raise ConfigError(name, f"must be a positive whole number (got {count})")
    return count


MAX_SHARDS = 64  # per queue: every worker and consumer polls each shard in turn


def _parse_shards(name: str, value: str) -> int:
    count = _parse_count(name, value)
    if count > MAX_SHARDS:
        raise ConfigError(name, f"must be at most {MAX_SHARDS} (got {count})")
    return count


def _parse_secret(name: str, value: str) -> Secret:
    if not value:
        raise ConfigError(name, "is set but empty")
    return Secret(value)


def _parse_text(name: str, value: str) -> str:
    return value


DURABLE_ACKS = ("none", "aof")


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(name, "must be true or false")


def _parse_origins(name: str, value: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())
    for origin in origins:
        if not origin.startswith(("http://", "https://")) or "/" in origin.split("://", 1)[1]:
            raise ConfigError(name, f"{origin[:60]!r} is not an origin (scheme://host[:port])")
    return origins


def _parse_durable_ack(name: str, value: str) -> str:
    if value not in DURABLE_ACKS:
        raise ConfigError(name, f"must be one of {', '.join(DURABLE_ACKS)}")
    return value


def parse_webhook_secrets(name: str, value: str) -> dict[str, WebhookSource]:
    """``source=[scheme:]secret,...``; errors name the source, never the secret."""
    sources: dict[str, WebhookSource] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        source, sep, spec = part.partition("=")
        source = source.strip()
        if not sep or not source or not spec:
            raise ConfigError(name, f"entry {len(sources) + 1} is not source=secret")
        if not WEBHOOK_SOURCE.match(source):
            raise ConfigError(name, f"source {source!r}: a name is 1-64 letters, digits "
                              "and _ . @ -")
        scheme, colon, secret = spec.partition(":")
        if not colon or scheme not in WEBHOOK_SCHEMES:
            scheme, secret = "standard", spec
        if not secret:
            raise ConfigError(name, f"source {source!r} has an empty secret")
        if source in sources:
            raise ConfigError(name, f"source {source!r} appears twice")
        entry = WebhookSource(source, scheme, Secret(secret))
        if scheme == "standard":
            try:
                if not entry.key_bytes():
                    raise ValueError
            except (binascii.Error, ValueError):
                raise ConfigError(
                    name, f"source {source!r}: standard secret must be whsec_<base64>"
                ) from None
        sources[source] = entry
    return sources


_ENV: dict[str, tuple[str, Any]] = {
    "GATEWAY_DURABLE_URL": ("durable_url", _parse_redis_url),
    "GATEWAY_CACHE_URL": ("cache_url", _parse_redis_url),
    "GATEWAY_DATABASE_URL": ("database_url", _parse_pg_url),
    "GATEWAY_HOST": ("host", _parse_text),
    "GATEWAY_PORT": ("port", _parse_port),
    "GATEWAY_ADMIN_TOKEN": ("admin_token", _parse_secret),
    "GATEWAY_WEBHOOK_SECRETS": ("webhook_sources", parse_webhook_secrets),
    "TELEGRAM_BOT_TOKEN": ("telegram_bot_token", _parse_secret),
    "TELEGRAM_WEBHOOK_SECRET": ("telegram_webhook_secret", _parse_secret),
    "TELEGRAM_API_URL": ("telegram_api_url", _parse_http_url),
    "SLACK_BOT_TOKEN": ("slack_bot_token", _parse_secret),
    "SLACK_SIGNING_SECRET": ("slack_signing_secret", _parse_secret),
    "SLACK_API_URL": ("slack_api_url", _parse_http_url),
    "MATTERMOST_URL": ("mattermost_url", _parse_http_url),
    "MATTERMOST_TOKEN": ("mattermost_token", _parse_secret),
    "GATEWAY_DEDUP_TTL": ("dedup_ttl", _parse_seconds),
    "GATEWAY_LEASE_SECONDS": ("lease_seconds", _parse_seconds),
    "GATEWAY_HEARTBEAT_SECONDS": ("heartbeat_seconds", _parse_seconds),
    "GATEWAY_RECLAIM_SECONDS": ("reclaim_seconds", _parse_seconds),
    "GATEWAY_MAX_RECLAIMS": ("max_reclaims", _parse_seconds),
    "GATEWAY_MAX_FAILURES": ("max_failures", _parse_seconds),
    "GATEWAY_LISTENER_LEASE_SECONDS": ("listener_lease_seconds", _parse_seconds),
    "GATEWAY_MAX_BODY_BYTES": ("max_body_bytes", _parse_seconds),
    "GATEWAY_MAX_CHUNKS_PER_DOCUMENT": ("max_chunks_per_document", _parse_count),
    "GATEWAY_MAX_EDGES_PER_DOCUMENT": ("max_edges_per_document", _parse_count),
    "GATEWAY_DURABLE_ACK": ("durable_ack", _parse_durable_ack),
    "GATEWAY_PIPELINE_SHARDS": ("pipeline_shards", _parse_shards),
    "GATEWAY_INBOX_SHARDS": ("inbox_shards", _parse_shards),
    "GATEWAY_JWT_SECRET": ("jwt_secret", _parse_secret),
    "GATEWAY_JWT_JWKS_URL": ("jwt_jwks_url", _parse_http_url),
    "GATEWAY_JWT_ISSUER": ("jwt_issuer", _parse_text),
    "GATEWAY_JWT_AUDIENCE": ("jwt_audience", _parse_text),
    "GATEWAY_METRICS_PUBLIC": ("metrics_public", _parse_bool),
    "GATEWAY_CORS_ORIGINS": ("cors_origins", _parse_origins),
}
ENV_VARIABLES = tuple(_ENV)


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("GATEWAY_CONFIG", f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("GATEWAY_CONFIG", f"{path} is not valid TOML: {exc}") from None


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Build settings from ``GATEWAY_CONFIG`` (TOML, optional) overlaid with the environment.

    In the TOML file, the ``[gateway]`` table takes the same names as the variables in lower
    case without prefix (``port = 8080``, ``durable_url = ...``); other tables are kept as
    ``sections`` for the modules that own them.
    """
    env = os.environ if environ is None else environ
    raw: dict[str, str] = {}
    sections: dict[str, Any] = {}
    config_path = env.get("GATEWAY_CONFIG")
    if config_path:
        data = _load_toml(Path(config_path))
        for key, value in data.get("gateway", {}).items():
            variable = _toml_key_to_env(key)
            if variable is None:
                raise ConfigError(f"GATEWAY_CONFIG [gateway].{key}", "unknown setting")
            raw[variable] = ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(
                value, dict
            ) else str(value)
        sections = {k: v for k, v in data.items() if k != "gateway"}
    for variable in _ENV:
        if variable in env and env[variable] != "":
            raw[variable] = env[variable]
    values: dict[str, Any] = {}
    for variable, text in raw.items():
        fieldname, parse = _ENV[variable]
        values[fieldname] = parse(variable, text)
    settings = Settings(**values, sections=sections)
    _check_consistency(settings)
    return settings


def _toml_key_to_env(key: str) -> str | None:
    for variable in _ENV:
        short = variable.lower().removeprefix("gateway_")
        if key in (short, variable.lower()):
            return variable
    return None


def _check_consistency(settings: Settings) -> None:
    if settings.heartbeat_seconds >= settings.lease_seconds:
        raise ConfigError(
            "GATEWAY_HEARTBEAT_SECONDS", "must be shorter than GATEWAY_LEASE_SECONDS"
        )
    if settings.mattermost_url and not settings.mattermost_token:
        raise ConfigError("MATTERMOST_TOKEN", "is required when MATTERMOST_URL is set")


def field_types(cls: Any, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """A dataclass's fields as the ``types`` of ``positive_numbers``: for the TOML tables
    whose keys are exactly a settings class's field names."""
    return {spec.name: spec.type for spec in fields(cls) if spec.name not in exclude}


T = TypeVar("T")


def tunables(cls: Callable[..., T], settings: Settings, table: str,
             other: tuple[str, ...] = ()) -> T:
    """A settings dataclass from the TOML table ``[table]`` whose keys are exactly its
    fields, all positive numbers (absent ones keep their defaults), besides the keys in
    ``other``, left to their own reader."""
    return cls(**positive_numbers(settings.section(table), field_types(cls), f"[{table}]",
                                  other))


def positive_numbers(section: Mapping[str, Any], types: Mapping[str, Any],
                     label: str, other: tuple[str, ...] = ()) -> dict[str, int | float]:
    """A TOML table of positive tunables: ``types`` maps each allowed key to its field type
    (``int`` or ``"int"``, anything else is a float); keys in ``other`` are allowed and left
    to their own reader; errors name ``<label>.<key>``."""
    values: dict[str, int | float] = {}
    for name, raw in section.items():
        if name in other:
            continue
        if name not in types:
            raise ConfigError(f"{label}.{name}", "unknown setting")
        kind = int if types[name] in ("int", int) else float
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{label}.{name}", f"must be a number (got {raw!r})") from None
        if value <= 0:
            raise ConfigError(f"{label}.{name}", "must be positive")
        values[name] = value
    return values


def redact_url(url: str | None) -> str:
    """A URL fit for logs: the password (if any) replaced by ``***``."""
    if not url:
        return "-"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
