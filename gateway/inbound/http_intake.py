"""What the inbound routes share on one application: the durable client's ``AutoPipeline``,
the claim-and-enqueue ``Intaker``, the brute-force barrier, the maintenance switch, and the
request checks that come before any store is touched (content type, bounded body).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote  # C, no encoder set-up

from aiohttp import web

from gateway.api.errors import RETRY_AFTER_SECONDS, ApiError
from gateway.api.prepared import PreparedJson
from gateway.api.spec import Answer, obj, one_of, string
from gateway.api.state import add_readiness_check
from gateway.config import Settings
from gateway.dedup.intake import Intake, Intaker
from gateway.inbound import quotas
from gateway.inbound.admission import Admission
from gateway.leases.maintenance import MaintenanceView, view_for
from gateway.pipeline.queue import AdmissionClass
from gateway.security.brute import BruteBarrier, BruteSettings
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import Runtime, durable_pipeline

READ_CHUNK = 64 * 1024
# The two answers of an intake, as the routes' descriptions give them.
ACCEPTED = Answer("taken in: queued in the pipeline", obj(
    {"status": one_of("accepted"), "item_id": string()}))
DUPLICATE = Answer("seen before: nothing is queued again", obj(
    {"status": one_of("duplicate"), "item_id": string("the first delivery's item")}))
MAINTENANCE = "maintenance mode is on, or redis-durable is too full to take this in"
_ANSWERS = {Intake.ACCEPTED: (202, b'{"status": "accepted", "item_id": '),
            Intake.DUPLICATE: (200, b'{"status": "duplicate", "item_id": ')}


@dataclass(frozen=True)
class Inbound:
    settings: Settings
    auto: AutoPipeline
    intaker: Intaker
    barrier: BruteBarrier
    maintenance: MaintenanceView
    admission: Admission
    quotas: quotas.QuotaSettings


INBOUND: web.AppKey[Inbound] = web.AppKey("inbound", Inbound)


def install(app: web.Application, runtime: Runtime) -> Inbound:
    """Create the shared state once per application (both components call this)."""
    if INBOUND in app:
        return app[INBOUND]
    auto = durable_pipeline(runtime)
    inbound = Inbound(runtime.settings, auto, Intaker(auto, runtime.settings.dedup_ttl),
                      BruteBarrier(auto, BruteSettings.from_section(
                          runtime.settings.section("security"),
                          exempt_loopback=runtime.settings.dev)),
                      view_for(runtime.durable),
                      Admission(runtime.durable, runtime.settings.section("admission")),
                      quotas.QuotaSettings.from_section(runtime.settings.section("quotas")))
    app[INBOUND] = inbound
    add_readiness_check(app, "admission", inbound.admission.readiness, required=False)

    async def drain(app: web.Application) -> AsyncIterator[None]:
        yield
        await auto.drain()  # unawaited writes (claims turning done) go out before the close

    app.cleanup_ctx.append(drain)
    return inbound


async def refuse_during_maintenance(view: MaintenanceView) -> None:
    """503 + ``Retry-After`` while maintenance mode is on: the sender (or platform) retries
    later, and nothing is accepted that a restore could lose."""
    state = view.state if view.fresh else await view.current()
    if state.on:
        raise ApiError(503, "maintenance", state.reason or "maintenance",
                       {"Retry-After": str(state.retry_after)})


def require_json(request: web.Request) -> None:
    """415 unless the body is declared JSON (``application/json`` or ``*/*+json``)."""
    if request.headers.get("Content-Type") == "application/json":  # as senders write it
        return
    mime = request.content_type
    if mime != "application/json" and not mime.endswith("+json"):
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Type must be application/json (got {mime or 'none'})")


def body_at_hand(request: web.Request, limit: int) -> bytes | None:
    """The body when it is declared within ``limit`` (aiohttp enforces it) and complete
    already, as a small body that arrived with the headers is: taken without a read loop or
    a coroutine. None when ``read_body`` must read it."""
    length = request.content_length  # parsed from the header on each read
    if length is not None and length <= limit and request.content.is_eof():
        # Empty when the route guard has read a slow body already (request.read caches).
        return request.content.read_nowait() or None
    return None


async def read_body(request: web.Request) -> bytes:
    """The body, refused with 413 as soon as it passes the limit: a chunked body carries no
    Content-Length for the route guard to check, so the count happens while reading."""
    limit = request.app[INBOUND].settings.max_body_bytes
    body = body_at_hand(request, limit)
    if body is not None:
        return body
    length = request.content_length
    if length is not None and length <= limit:
        return await request.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "payload_too_large", f"body is over the limit of {limit} bytes",
                           {"Connection": "close"})
        chunks.append(chunk)
    return b"".join(chunks)


async def admitted_or_known(inbound: Inbound, cls: str,
                            claim_key: str | None) -> AdmissionClass | None:
    """Admission for ``cls`` (what ADD needs for the exact check); while it is closed, a
    delivery already taken in (its claim is there) is still known: None then, and the caller
    answers it ``duplicate``, so a sender stops retrying what is safe. Anything else refused
    is the 503 of admission."""
    try:
        return await inbound.admission.admit(cls)
    except ApiError:
        if claim_key is not None and int(await inbound.auto.execute("EXISTS", claim_key)):
            return None
        raise


def intake_answer(outcome: Intake, item_id: str) -> web.Response:
    """202 ``{"status": "accepted", "item_id"}`` or 200 ``{"status": "duplicate", ...}``,
    encoded without building a dict per request, its head encoded once (``PreparedJson``):
    this is the hot path of the ingest bench."""
    answer = _ANSWERS.get(outcome)
    if outcome is Intake.OVER_CLASS:
        raise ApiError(503, "backpressure", "the pipeline holds its share of redis-durable's "
                       "memory for this class of sender; retry once the queues drain",
                       {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if answer is None:  # over quota (a revoked credential's refusal is the route's to make)
        raise quotas.exceeded()
    status, head = answer
    return PreparedJson(status, head + _quote(item_id).encode() + b"}")
