"""``POST /v1/jobs`` (enqueue a document, idempotent on ``job_id``) and ``GET /v1/jobs/{id}``.

A job with a ``job_id`` claims ``dedup:job:<item id>`` in the same round trip as its ADD, so a
repeated POST answers 200 duplicate with the same item id; a job without one gets a fresh
random item id and needs no claim. Validation happens before anything is written.

Job ids belong to the credential that submits them: an API key's or an account's item ids are
``<owner>/<job_id>`` (``k.<key id>``, ``u.<hash of sub>``), so another credential can neither
take a job id first nor read the job; the admin token's are the bare job ids and it reads
every job. ``high`` priority needs the ``jobs:priority`` scope (or ``jobs:critical``),
``critical`` the ``jobs:critical`` scope: without them a client's jobs queue behind what came
before (a flood of "high" jobs from one client once ran ahead of an earlier webhook). A type
with a bonus (``api_docs``, ``code``) ranks a job ahead as well and needs ``jobs:priority`` too.
Submissions are limited per credential (``[access] jobs_per_minute``, 600, 0 for none; the
admin token is not), so one client cannot crowd out the others: 429 + ``Retry-After`` past it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway import keys
from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, mapping, obj, one_of, string
from gateway.api.state import REFUSE, RUNTIME, Principal, principal_of
from gateway.dedup.intake import Intake
from gateway.inbound.documents import parse_json
from gateway.inbound.http_intake import (
    ACCEPTED,
    DUPLICATE,
    INBOUND,
    MAINTENANCE,
    install,
    intake_answer,
    read_body,
    refuse_during_maintenance,
    require_json,
)
from gateway.inbound.signing import MAX_ID_LENGTH, MalformedError
from gateway.pipeline.stages import PRIORITY_BASE, TYPE_BONUS
from gateway.pipeline.status import job_status
from gateway.ratelimit import Limiter
from gateway.ratelimit.credential import CredentialRate
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import Runtime

# Webhook items are "webhook:<source>:<id>"; a job_id may not impersonate one.
RESERVED_PREFIX = keys.WEBHOOK_ITEM_PREFIX


def _bad(detail: str) -> ApiError:
    return ApiError(400, "malformed", detail)


def _optional_str(document: Mapping[str, Any], name: str) -> None:
    if name in document and not isinstance(document[name], str):
        raise _bad(f"document.{name} must be a string")


def _job_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH or not all(
            33 <= ord(c) < 127 for c in value):
        raise _bad(f"job_id must be 1-{MAX_ID_LENGTH} printable ASCII characters, no spaces")
    if value.startswith(RESERVED_PREFIX):
        raise _bad(f"job_id may not start with {RESERVED_PREFIX!r}")
    return value


def parse_job(payload: Any) -> tuple[str | None, str, str, dict[str, Any]]:
    """(job_id, priority, type, document) of a valid body, or 400 saying what is wrong."""
    if not isinstance(payload, dict):
        raise _bad("body must be a JSON object")
    job_id = _job_id(payload.get("job_id"))
    priority = payload.get("priority", "normal")
    if not isinstance(priority, str) or priority not in PRIORITY_BASE:
        raise _bad(f"priority must be one of {', '.join(PRIORITY_BASE)}")
    doc_type = payload.get("type", "other")
    if not isinstance(doc_type, str) or doc_type not in TYPE_BONUS:
        raise _bad(f"type must be one of {', '.join(TYPE_BONUS)}")
    document = payload.get("document")
    if not isinstance(document, dict):
        raise _bad("document must be an object with a text string")
    if not isinstance(document.get("text"), str) or not document["text"].strip():
        raise _bad("document.text must be a non-empty string")
    _optional_str(document, "title")
    _optional_str(document, "url")
    return job_id, priority, doc_type, document


async def submit_job(request: web.Request) -> web.Response:
    inbound = request.app[INBOUND]
    await refuse_during_maintenance(inbound.maintenance)
    admission = await inbound.admission.admit("jobs")
    require_json(request)
    try:
        job_id, priority, doc_type, document = parse_job(parse_json(await read_body(request)))
    except MalformedError as exc:
        raise _bad(str(exc)) from None
    principal = principal_of(request)
    _may_ask(principal, priority, doc_type)
    if not principal.is_admin:
        await request.app[JOB_RATE].admit(principal.owner)
    item_id = _owned(principal, job_id or uuid.uuid4().hex)
    outcome = await inbound.intaker.submit(
        keys.dedup_job(item_id) if job_id else None, item_id, document,
        priority=priority, doc_type=doc_type, guard=principal.revocation_mark,
        quota=inbound.quotas.for_credential(principal.owner, inbound.admission.maxmemory),
        admission=admission)
    if outcome is Intake.REFUSED:  # the credential was revoked: nothing was written
        raise await request.app[REFUSE](request, "unknown or revoked API key")
    return intake_answer(outcome, item_id)


# Priority is a grant: a job of a credential without it runs after the ones queued before
# it (webhooks, other clients' jobs), so one client's jobs cannot push everyone else back.
# A type with a bonus (api_docs, code: 50-83 minutes of queue age) is priority too.
PRIORITY_SCOPES = {"high": ("jobs:priority", "jobs:critical"), "critical": ("jobs:critical",)}
BONUS_SCOPES = ("jobs:priority", "jobs:critical")


def _may_ask(principal: Principal, priority: str, doc_type: str) -> None:
    needed = PRIORITY_SCOPES.get(priority, ())
    if needed and not any(principal.allows(scope) for scope in needed):
        raise ApiError(403, "forbidden", f"priority {priority} needs the scope {needed[0]}")
    if TYPE_BONUS[doc_type] and not any(principal.allows(scope) for scope in BONUS_SCOPES):
        raise ApiError(403, "forbidden", f"type {doc_type} ranks the job ahead of earlier "
                       f"work: it needs the scope {BONUS_SCOPES[0]}")


def _owned(principal: Principal, job_id: str) -> str:
    """The item id of ``job_id`` in the principal's namespace (a full item id of its own is
    accepted as is, so the ``item_id`` a POST answered can be read back)."""
    owner = principal.owner
    if not owner or job_id.startswith(owner + "/"):
        return job_id
    return f"{owner}/{job_id}"


async def get_job(request: web.Request) -> web.Response:
    item_id = _owned(principal_of(request), request.match_info["id"])
    # Item ids are printable text of bounded length; anything else (a NUL or a lone surrogate,
    # which PostgreSQL would refuse) cannot name an item.
    plausible = len(item_id) <= 4 * MAX_ID_LENGTH and item_id.isprintable()
    status = await job_status(request.app[RUNTIME], item_id) if plausible else None
    if status is None:
        raise ApiError(404, "not_found", f"no job {item_id!r}")
    return web.json_response(status)


def job_rate(runtime: Runtime, auto: AutoPipeline) -> CredentialRate:
    """The per-credential submission limit (a sliding window in ``rl:``)."""
    per_minute = int(runtime.settings.section("access").get("jobs_per_minute", 600))
    return CredentialRate(Limiter(runtime.durable, auto), "jobs", per_minute, 60,
                          "jobs a minute for this credential")


JOB_RATE: web.AppKey[CredentialRate] = web.AppKey("job_rate", CredentialRate)


JOB = obj(
    {"document": obj({"text": string("the document's text", minLength=1)},
                     {"title": string(), "url": string()}, more=True)},
    {"job_id": string("makes the POST idempotent: again, it answers 200 duplicate",
                      minLength=1, maxLength=MAX_ID_LENGTH, pattern="^[!-~]+$",
                      **{"not": {"pattern": f"^{RESERVED_PREFIX}"}}),
     "priority": one_of(*PRIORITY_BASE, default="normal",
                        description="high needs the scope jobs:priority (or "
                                    "jobs:critical), critical needs jobs:critical"),
     "type": one_of(*TYPE_BONUS, default="other",
                    description="api_docs and code rank the job ahead: they need the scope "
                                "jobs:priority (or jobs:critical)")}, more=True)
SUBMIT = Operation(
    "Queue a document in the pipeline",
    {202: ACCEPTED, 200: DUPLICATE},
    errors={400: "the body is not a valid job (malformed)",
            401: "the API key was revoked",
            403: "priority high or type api_docs or code without jobs:priority (or "
                 "jobs:critical), or critical without jobs:critical",
            415: "the body is not declared application/json",
            429: "over [access] jobs_per_minute for this credential (rate_limited), or this "
                 "credential holds its quota of queued items (quota_exceeded)",
            503: MAINTENANCE},
    body=JOB, tag="jobs")
STATUS = Operation(
    "A job's state and its stages'",
    {200: Answer("the job", obj({
        "item_id": string(), "state": one_of("queued", "running", "done", "dead"),
        "stages": mapping(one_of("pending", "queued", "running", "retrying", "done", "dead"),
                          "by stage")}))},
    errors={404: "no such job of this credential"},
    params=(Param("id", string(minLength=1), "the job_id, or the item_id a POST answered",
                  where="path", required=True),),
    tag="jobs")


def setup(app: web.Application, runtime: Runtime) -> None:
    inbound = install(app, runtime)
    app[JOB_RATE] = job_rate(runtime, inbound.auto)
    # The API key's revocation mark is read by the enqueue script itself (no round trip).
    routes.post(app, "/v1/jobs", submit_job, scope="jobs:write", checks_revocation=True,
                doc=SUBMIT, budget=routes.WRITE_BUDGET_SECONDS)
    routes.get(app, "/v1/jobs/{id}", get_job, scope="jobs:read", doc=STATUS)
