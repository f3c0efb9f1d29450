"""The Standard Webhooks signature (standardwebhooks.com), one implementation for both ways:
verifying what comes in (``gateway.inbound.signing``) and signing what the gateway sends
(notifications, ``gateway sign``)."""

from __future__ import annotations

import base64
import hmac


def standard_signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    # surrogateescape: a header with bytes that are not UTF-8 reaches us with surrogates;
    # this restores the bytes the sender signed instead of failing.
    digest = hmac.digest(key, f"{msg_id}.{timestamp}.".encode("utf-8", "surrogateescape")
                         + body, "sha256")
    return "v1," + base64.b64encode(digest).decode()


def sign_standard(secret_key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers a Standard Webhooks sender puts on a request."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_signature(secret_key, msg_id, timestamp, body),
    }
