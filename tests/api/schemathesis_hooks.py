"""Schemathesis hooks of ``tests/api/test_schemathesis.py`` (loaded by its CLI run): every
delivery to ``/v1/webhooks/demo`` is signed with the demo source's secret (Standard
Webhooks), as a sender holding the secret would, so the generated bodies reach past the
signature check into the intake instead of all ending in 401."""

from __future__ import annotations

import json
import uuid
from typing import Any

import schemathesis

from tests.inbound.webhook_helpers import standard


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if case.operation.path != "/v1/webhooks/{source}" or (
            case.path_parameters or {}).get("source") != "demo":
        return
    serialized = case.as_transport_kwargs(base_url="http://127.0.0.1")
    body = serialized.get("data")
    if "json" in serialized:  # the bytes requests would send for json=
        body = json.dumps(serialized["json"], allow_nan=False).encode()
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes) or not body:
        return  # nothing to sign: the delivery goes unsigned (401)
    kwargs["data"] = body  # sent as signed; it takes precedence over json=
    signed = standard(body, f"msg_{uuid.uuid4().hex}")
    headers = dict(case.headers or {})
    headers.update({k: v for k, v in signed.items() if k != "Content-Type"})
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = signed["Content-Type"]
    case.headers = headers
