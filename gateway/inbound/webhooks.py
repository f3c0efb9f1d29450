"""``POST /v1/webhooks/{source}``: signed webhooks in, pipeline items out.

Order of the checks, cheapest and least revealing first: unknown source (404, no store
touched), blocked address (429), content type (415), body size (413, refused while reading,
chunked or not), signature (401, counted by the brute-force barrier unless it matched and
only its timestamp is stale), body shape (400),
freshness when configured (400, ``gateway.inbound.replay``). Only then is anything written:
for a source with a body window (GitHub's default), the body's replay mark; then the dedup
claim ``dedup:webhook:<source>:<delivery id>`` and the ADD of item
``webhook:<source>:<delivery id>`` go out together (``gateway.dedup.intake``). So a refused
request writes nothing but a failure count, and an accepted one is queued before the 202
leaves.

``gateway sign`` (``main_sign``) prints the Standard Webhooks headers for a body.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from aiohttp import web

from gateway import keys
from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import ANY_JSON, Operation, Param, string
from gateway.api.state import PUBLIC
from gateway.config import Settings, WebhookSource
from gateway.dedup.intake import Intake
from gateway.inbound import signing
from gateway.inbound.documents import parse_json_text, webhook_payload
from gateway.inbound.http_intake import (
    ACCEPTED,
    DUPLICATE,
    INBOUND,
    MAINTENANCE,
    admitted_or_known,
    body_at_hand,
    install,
    intake_answer,
    read_body,
    refuse_during_maintenance,
    require_json,
)
from gateway.inbound.replay import ReplayGuard
from gateway.stores.runtime import Runtime

REPLAY: web.AppKey[ReplayGuard] = web.AppKey("webhook_replay", ReplayGuard)


def item_id_for(source: str, delivery_id: str) -> str:
    """Item ids of webhooks are ``webhook:<source>:<delivery id>``: unique per sender and
    delivery; ``POST /v1/jobs`` refuses job ids with this prefix, so the two cannot collide."""
    return f"{keys.WEBHOOK_ITEM_PREFIX}{source}:{delivery_id}"


class Verified(NamedTuple):
    delivery_id: str
    payload: str  # the pipeline document, JSON-encoded
    value: Any  # the parsed body


def _verified(request: web.Request, name: str, source: WebhookSource, body: bytes) -> Verified:
    """The signature checked and the body made a pipeline document, without an await (the
    failures are the caller's to answer: a bad signature is counted by the barrier)."""
    delivery_id = signing.verify(source, request.headers, body)
    text, value = parse_json_text(body)
    # GitHub names the event in a header; the other schemes in the body ("type").
    event = request.headers.get("X-GitHub-Event") if source.scheme == "github" else None
    payload = webhook_payload(name, delivery_id, text, value, event)
    return Verified(delivery_id, payload, value)


async def receive(request: web.Request) -> web.Response:
    # Awaits only where a value must be read first (a stale cache, a slow body, a store):
    # a coroutine per check would cost every request, most of which need none.
    app = request.app
    inbound = app[INBOUND]
    if not inbound.maintenance.fresh or inbound.maintenance.state.on:
        await refuse_during_maintenance(inbound.maintenance)
    name = request.match_info["source"]
    source = inbound.settings.webhook_sources.get(name)
    if source is None:
        raise ApiError(404, "unknown_source", f"no webhook source named {name!r} is configured")
    barrier = inbound.barrier
    ip = barrier.client_ip(request)
    if not barrier.known_clear(ip):
        await barrier.check(ip)
    require_json(request)
    body = body_at_hand(request, inbound.settings.max_body_bytes)
    if body is None:
        body = await read_body(request)
    try:
        verified = _verified(request, name, source, body)
    except signing.SignatureError as exc:
        blocked_for = await barrier.record_failure(ip)
        if blocked_for:
            raise barrier.refusal(blocked_for) from None
        raise ApiError(401, "bad_signature", str(exc)) from None
    except signing.StaleSignature as exc:  # a replay, not a guess: not counted
        raise ApiError(401, "stale_signature", str(exc)) from None
    except signing.MalformedError as exc:
        raise ApiError(400, "malformed", str(exc)) from None
    guard = app[REPLAY]
    policy = guard.policies[name]
    if policy.fields:
        policy.check_fresh(request.headers.get("X-GitHub-Event"), verified.value, time.time())
    item_id = item_id_for(name, verified.delivery_id)
    claim_key = keys.dedup_webhook(name, verified.delivery_id)
    admission = inbound.admission.admitted_now("webhooks")
    if admission is None:
        admission = await admitted_or_known(inbound, "webhooks", claim_key)
        if admission is None:
            return intake_answer(Intake.DUPLICATE, item_id)
    if policy.window:
        first = await guard.first_delivery(name, body, verified.delivery_id, policy.window)
        if first != verified.delivery_id:  # the same signed body under a fresh delivery id
            return intake_answer(Intake.DUPLICATE, item_id_for(name, first))
    outcome = await inbound.intaker.submit(
        claim_key, item_id, verified.payload, admission=admission,
        quota=inbound.quotas.for_source(name, inbound.admission.maxmemory))
    return intake_answer(outcome, item_id)


SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature", "Stripe-Signature",
                     "X-Hub-Signature-256", "X-GitHub-Delivery")
RECEIVE = Operation(
    "A signed webhook from a configured source, queued in the pipeline",
    {202: ACCEPTED, 200: DUPLICATE},
    errors={400: "the body or its delivery id is unusable (malformed), or a GitHub delivery "
                 "is stale or carries no timestamp (stale_delivery, no_timestamp)",
            401: "the signature is missing or wrong (bad_signature), or its timestamp is "
                 "out of tolerance (stale_signature)",
            404: "no source of that name is configured (unknown_source)",
            415: "the body is not declared application/json",
            429: "this address sent too many bad signatures (blocked for a cool-down), or "
                 "the source holds its quota of queued items (quota_exceeded)",
            503: MAINTENANCE},
    body=ANY_JSON,
    params=(Param("source", string(), "a source of GATEWAY_WEBHOOK_SECRETS", where="path",
                  required=True),
            *(Param(name, string(), "signature header (by the source's scheme)",
                    where="header") for name in SIGNATURE_HEADERS)),
    signed=("Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature; Stripe: "
            "Stripe-Signature; GitHub: X-Hub-Signature-256 and X-GitHub-Delivery",),
    tag="webhooks")


def setup(app: web.Application, runtime: Runtime) -> None:
    inbound = install(app, runtime)
    app[REPLAY] = ReplayGuard(inbound.auto, runtime.settings)
    routes.post(app, "/v1/webhooks/{source}", receive, scope=PUBLIC, doc=RECEIVE,  # signed
                budget=routes.WRITE_BUDGET_SECONDS)


# --- gateway sign ----------------------------------------------------------------------------


def _secret_key(secret: str) -> bytes:
    body = secret.removeprefix("whsec_")
    try:
        return base64.b64decode(body, validate=True)
    except ValueError:
        raise SystemExit("gateway sign: --secret must be whsec_<base64>") from None


def main_sign(args: argparse.Namespace, settings: Settings) -> int:
    """Print ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` header lines."""
    try:
        body = (sys.stdin.buffer.read() if args.bodyfile == "-"
                else Path(args.bodyfile).read_bytes())
    except OSError as exc:
        raise SystemExit(f"gateway sign: cannot read {args.bodyfile}: "
                         f"{exc.strerror or exc}") from None
    timestamp = int(time.time()) if args.timestamp is None else int(args.timestamp)
    headers = signing.sign_standard(_secret_key(args.secret), args.msg_id, timestamp, body)
    for name, value in headers.items():
        print(f"{name}: {value}")
    return 0
