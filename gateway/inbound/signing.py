"""Signature schemes of inbound webhooks: Standard Webhooks, GitHub and Stripe.

Each verifier takes the configured source, the request headers and the raw body, and returns
the delivery id the sender put on the request (the dedup key) or raises ``SignatureError``.
They are a few lines of ``hmac`` each: the official SDKs (``standardwebhooks``, ``stripe``)
pull in HTTP clients and date parsers for the same dozen lines, and none covers all three.
Every comparison is constant-time (``hmac.compare_digest``); timestamps are checked against a
tolerance so a captured request cannot be replayed later.

Three kinds of refusal, because the brute-force barrier must tell them apart:
``SignatureError`` (a missing or malformed signature header, or a well-formed signature that
does not match: counted), ``StaleSignature`` (the signature matches but its timestamp is
outside the tolerance: a replay or a skewed clock, which proves possession of a genuine
request rather than a guess, so not counted) and ``MalformedError`` (signed, but an unusable
id or body: 400, not counted).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

from gateway.config import WebhookSource
from gateway.outbound.standard_webhooks import Signer
from gateway.outbound.standard_webhooks import sign_standard as sign_standard  # re-export
from gateway.outbound.standard_webhooks import standard_signature as standard_signature

TOLERANCE_SECONDS = 5 * 60
# A delivery id becomes part of a Redis key: printable ASCII without spaces, bounded.
MAX_ID_LENGTH = 200


class SignatureError(Exception):
    """The request is not provably from the configured sender (answer 401)."""


class StaleSignature(Exception):
    """Correctly signed, but the signed timestamp is outside the tolerance: a replay or a
    sender's clock gone wrong, not a guess at the secret (answer 401, not counted)."""


class MalformedError(Exception):
    """The request is signed correctly but unusable as sent (answer 400)."""


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise SignatureError(f"missing {name} header")
    return value


def _check_id(delivery_id: str, header: str) -> str:
    if (len(delivery_id) > MAX_ID_LENGTH or not delivery_id.isascii()
            or not delivery_id.isprintable() or " " in delivery_id):
        raise MalformedError(f"{header} must be 1-{MAX_ID_LENGTH} printable ASCII characters")
    return delivery_id


def _parse_timestamp(text: str, header: str) -> int:
    try:
        timestamp = int(text)
        if len(text) > 20:  # a 400-digit "timestamp" would overflow the float comparison
            raise ValueError
    except ValueError:
        raise SignatureError(f"{header} is not a Unix timestamp") from None
    return timestamp


def _check_fresh(timestamp: int, now: float, header: str) -> None:
    """After the signature matched: only then is an old timestamp a replay, not garbage."""
    if abs(now - timestamp) > TOLERANCE_SECONDS:
        raise StaleSignature(f"{header} is outside the {TOLERANCE_SECONDS} s tolerance")


@functools.lru_cache(maxsize=256)
def _key(source: WebhookSource) -> bytes:
    """The decoded HMAC key, once per source rather than once per request."""
    return source.key_bytes()


# --- Standard Webhooks (standardwebhooks.com) ------------------------------------------------


# id(source) -> (source, its signer). By identity: hashing the frozen source for an
# lru_cache costs as much as the rest of the lookup, on every verified webhook.
_SIGNERS: dict[int, tuple[WebhookSource, Signer]] = {}


def _signer(source: WebhookSource) -> Signer:
    """The source's key with its HMAC pads hashed, once per source (the ingest path)."""
    entry = _SIGNERS.get(id(source))
    if entry is None or entry[0] is not source:
        if len(_SIGNERS) >= 256:
            _SIGNERS.clear()
        entry = _SIGNERS[id(source)] = (source, Signer(_key(source)))
    return entry[1]


def verify_standard(source: WebhookSource, headers: Mapping[str, str], body: bytes,
                    now: float) -> str:
    msg_id = _header(headers, "webhook-id")
    timestamp = _parse_timestamp(_header(headers, "webhook-timestamp"), "webhook-timestamp")
    expected = _signer(source).standard(msg_id, timestamp, body)
    # Several space-separated signatures let a sender rotate its secret without downtime.
    for sig in _header(headers, "webhook-signature").split():
        if sig.startswith("v1,") and hmac.compare_digest(expected,
                                                         sig.encode("utf-8", "replace")):
            break
    else:
        raise SignatureError("no matching v1 signature in webhook-signature")
    _check_fresh(timestamp, now, "webhook-timestamp")
    return _check_id(msg_id, "webhook-id")


# --- GitHub ----------------------------------------------------------------------------------


def github_signature(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.digest(secret, body, "sha256").hex()


def verify_github(source: WebhookSource, headers: Mapping[str, str], body: bytes,
                  now: float) -> str:
    """``X-Hub-Signature-256: sha256=<hex>`` over the body; GitHub signs no timestamp, so
    replays are stopped only by dedup on ``X-GitHub-Delivery``."""
    delivery = _header(headers, "X-GitHub-Delivery")
    offered = _header(headers, "X-Hub-Signature-256").strip()
    expected = github_signature(_key(source), body)
    if not hmac.compare_digest(expected.encode(), offered.encode("utf-8", "replace")):
        raise SignatureError("X-Hub-Signature-256 does not match")
    return _check_id(delivery, "X-GitHub-Delivery")


# --- Stripe ----------------------------------------------------------------------------------


def stripe_signature(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.digest(secret, f"{timestamp}.".encode() + body, "sha256").hex()


def sign_stripe(secret: bytes, timestamp: int, body: bytes) -> dict[str, str]:
    return {"Stripe-Signature": f"t={timestamp},v1={stripe_signature(secret, timestamp, body)}"}


def verify_stripe(source: WebhookSource, headers: Mapping[str, str], body: bytes,
                  now: float) -> str:
    """``Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...]`` over ``t.body``. The delivery id
    is the SHA-256 of the signed body: Stripe's event id lives inside the JSON, and a resent
    event carries the same body."""
    fields: dict[str, list[str]] = {}
    for item in _header(headers, "Stripe-Signature").split(","):
        name, _, value = item.strip().partition("=")
        fields.setdefault(name, []).append(value)
    timestamp = _parse_timestamp((fields.get("t") or [""])[0], "Stripe-Signature t")
    expected = stripe_signature(_key(source), timestamp, body).encode()
    if not any(hmac.compare_digest(expected, sig.encode("utf-8", "replace"))
               for sig in fields.get("v1", [])):
        raise SignatureError("no matching v1 signature in Stripe-Signature")
    _check_fresh(timestamp, now, "Stripe-Signature t")
    return "sha256-" + hashlib.sha256(body).hexdigest()


# --- Slack (checked here before Bolt sees the request) --------------------------------------


def verify_slack(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """``X-Slack-Signature: v0=<hex>`` over ``v0:<X-Slack-Request-Timestamp>:<body>``. Bolt
    checks the same, but fails with a traceback on a timestamp that is not a number, and
    cannot tell a stale genuine request from a forged one; this can, over the raw bytes."""
    text = _header(headers, "X-Slack-Request-Timestamp")
    timestamp = _parse_timestamp(text, "X-Slack-Request-Timestamp")
    expected = "v0=" + hmac.digest(secret, f"v0:{timestamp}:".encode() + body, "sha256").hex()
    offered = _header(headers, "X-Slack-Signature")
    if not hmac.compare_digest(expected.encode(), offered.encode("utf-8", "replace")):
        raise SignatureError("X-Slack-Signature does not match")
    _check_fresh(timestamp, now, "X-Slack-Request-Timestamp")


Verifier = Callable[[WebhookSource, Mapping[str, str], bytes, float], str]
VERIFIERS: dict[str, Verifier] = {
    "standard": verify_standard,
    "github": verify_github,
    "stripe": verify_stripe,
}


def verify(source: WebhookSource, headers: Mapping[str, str], body: bytes,
           now: float | None = None) -> str:
    """The delivery id of a correctly signed request; ``SignatureError`` otherwise."""
    return VERIFIERS[source.scheme](source, headers, body, time.time() if now is None else now)
