"""What a subscription is: a topic (a name, or a prefix ending in ``*``), the kinds it wants,
a destination (a signed HTTP endpoint, or a Telegram, Slack or Mattermost chat) and, for
chats, a message template. Requests are checked here, before anything is stored; the
template is rendered here too (a plain substitution of known fields: ``str.format`` would let
``{data.__class__}`` reach into objects)."""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.push import feed
from gateway.push.protocol import FeedError, FeedRow, check_topic

TYPES = ("webhook", "telegram", "slack", "mattermost")
CHAT_TYPES = TYPES[1:]
DEFAULT_TEMPLATE = "[{topic}] {kind}: {text}"
MAX_TEMPLATE = 2000
MAX_KINDS = 50
MAX_URL = 2048
MAX_CHAT_ID = 200
SECRET_PREFIX = "whsec_"
_FIELD = re.compile(r"\{([^{}]*)\}")
_DATA_NAME = re.compile(r"^data(\.[A-Za-z0-9_-]{1,100}){1,8}$")
_PLAIN_FIELDS = ("topic", "kind", "offset", "text")
# What a chat destination names, per type: the field and what it must look like.
CHAT_FIELDS = {"telegram": "chat_id", "slack": "channel", "mattermost": "channel_id"}
_CHAT_ID = re.compile(r"^[A-Za-z0-9_@.:/-]{1,200}$")


class Invalid(ValueError):
    """A subscription request the gateway refuses; the message is fit for a 400."""


@dataclass(frozen=True)
class Request:
    """A checked ``POST /v1/subscriptions`` body."""

    topic: str
    kinds: tuple[str, ...] | None
    destination: dict[str, Any]  # without the secret
    secret: str | None  # a webhook's signing secret (made when none was given)
    template: str | None
    after: int | None


def check_pattern(topic: Any) -> str:
    """A topic name, or a prefix ending in ``*`` (``*`` alone: every topic)."""
    if not isinstance(topic, str):
        raise Invalid("topic must be a string: a name, or a prefix ending in *")
    name = topic[:-1] if topic.endswith("*") else topic
    if name:
        try:
            check_topic(name if not name.endswith(":") else name + "x")
        except FeedError as exc:
            raise Invalid(f"topic: {exc}") from None
    elif topic != "*":
        raise Invalid("topic must not be empty")
    return topic


def parse_request(body: Any, *, allow_http: bool) -> Request:
    if not isinstance(body, dict):
        raise Invalid("body must be a JSON object")
    unknown = sorted(set(body) - {"topic", "kinds", "destination", "template", "after"})
    if unknown:
        raise Invalid(f"unknown field(s): {', '.join(u[:40] for u in unknown[:5])}")
    topic = check_pattern(body.get("topic"))
    kinds = _kinds(body.get("kinds"))
    destination, secret = parse_destination(body.get("destination"), allow_http=allow_http)
    template = body.get("template")
    if template is not None:
        if destination["type"] == "webhook":
            raise Invalid("a webhook destination gets the row as JSON: no template")
        check_template(template)
    after = body.get("after")
    if after is not None and (not isinstance(after, int) or isinstance(after, bool)
                              or not 0 <= after < 2**63):
        raise Invalid("after must be an offset (an integer >= 0)")
    return Request(topic, kinds, destination, secret, template, after)


def _kinds(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_KINDS:
        raise Invalid(f"kinds must be a list of 1-{MAX_KINDS} kinds")
    for kind in value:
        try:
            feed.check_row(kind, {})
        except FeedError as exc:
            raise Invalid(f"kinds: {exc}") from None
    return tuple(dict.fromkeys(value))


def parse_destination(value: Any, *, allow_http: bool) -> tuple[dict[str, Any], str | None]:
    """The destination without its secret, and the secret (webhooks only)."""
    if not isinstance(value, dict) or value.get("type") not in TYPES:
        raise Invalid(f"destination must be an object whose type is one of {', '.join(TYPES)}")
    kind = value["type"]
    if kind == "webhook":
        unknown = set(value) - {"type", "url", "secret"}
        if unknown:
            raise Invalid(f"destination: unknown field(s) {', '.join(sorted(unknown))[:100]}")
        return {"type": kind, "url": check_url(value.get("url"), allow_http=allow_http)}, \
            _secret(value.get("secret"))
    name = CHAT_FIELDS[kind]
    if set(value) - {"type", name}:
        raise Invalid(f"a {kind} destination is {{\"type\": \"{kind}\", \"{name}\"}}")
    chat = value.get(name)
    if isinstance(chat, int) and not isinstance(chat, bool):
        chat = str(chat)
    if not isinstance(chat, str) or not _CHAT_ID.match(chat):
        raise Invalid(f"destination.{name} must be 1-{MAX_CHAT_ID} characters of letters, "
                      "digits and _ @ . : / -")
    return {"type": kind, name: chat}, None


def check_url(url: Any, *, allow_http: bool) -> str:
    """An absolute ``https://`` URL (``http://`` too when allowed) with a host and no user
    information; where it points is checked by the outbound resolver."""
    if not isinstance(url, str) or not 1 <= len(url) <= MAX_URL or not url.isprintable():
        raise Invalid(f"destination.url must be a URL of at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Invalid("destination.url is not a valid URL") from None
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes:
        raise Invalid("destination.url must be https://" + (
            "" if allow_http else " ([notifications] allow_http is off)"))
    if not parts.hostname or parts.username is not None or parts.password is not None:
        raise Invalid("destination.url needs a host and no user:password@")
    if port == 0 or " " in url:
        raise Invalid("destination.url is not a valid URL")
    return url


def _secret(value: Any) -> str:
    if value is None:
        return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()
    if isinstance(value, str) and value.startswith(SECRET_PREFIX) and len(value) <= 200:
        try:
            if len(base64.b64decode(value[len(SECRET_PREFIX):], validate=True)) >= 16:
                return value
        except (binascii.Error, ValueError):
            pass
    raise Invalid("destination.secret must be whsec_<base64 of at least 16 bytes>")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret."""
    return base64.b64decode(secret[len(SECRET_PREFIX):])


def check_template(template: Any) -> str:
    if not isinstance(template, str) or not 1 <= len(template) <= MAX_TEMPLATE:
        raise Invalid(f"template must be a string of 1-{MAX_TEMPLATE} characters")
    for name in _FIELD.findall(template):
        if name not in _PLAIN_FIELDS and not _DATA_NAME.match(name):
            raise Invalid(f"template field {{{name[:60]}}} is unknown: use {{topic}}, "
                          "{kind}, {offset}, {text} or {data.<name>}")
    return template


def render(template: str | None, row: FeedRow) -> str:
    """The message of ``row``: each known field replaced, a missing one left empty."""
    payload = row.payload

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "topic":
            return row.topic
        if name == "kind":
            return row.kind
        if name == "offset":
            return str(row.offset)
        if name == "text":
            text = payload.get("text", payload.get("summary"))
            return text if isinstance(text, str) else ""
        if _DATA_NAME.match(name):
            found: Any = payload.get("data")
            for part in name.split(".")[1:]:
                found = found.get(part) if isinstance(found, dict) else None
            return "" if found is None else str(found)
        return match.group(0)

    return _FIELD.sub(value, template or DEFAULT_TEMPLATE)
