"""The OpenAPI 3.1 document of an application, built from its route table
(``gateway.api.routes.ROUTE_TABLE``): each route's own description (``gateway.api.spec``)
plus what the route guard does to every route, read from the route's scope: the security
requirement, and the 401/403/429/503 of a credential check, the 408/413 of a body.

``GET /v1/openapi.json`` (``gateway.web.reference``) builds it on its first request, when every
component has registered its routes, and keeps it: routes do not change while an application
runs.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.api.routes import ROUTE_TABLE
from gateway.api.spec import Answer, Operation, Route
from gateway.api.state import PUBLIC

ERROR = {
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. bad_request"},
        "detail": {"type": "string", "description": "what went wrong, for a person"},
    },
    "description": "Every 4xx and 5xx answer. Some add fields (/readyz adds checks).",
}

SECURITY_SCHEMES = {
    "bearer": {
        "type": "http", "scheme": "bearer",
        "description": "Authorization: Bearer <credential>: the admin token "
                       "(GATEWAY_ADMIN_TOKEN), an API key (gk_...) or an access token (JWT). "
                       "Each operation names the scope it needs; the admin token has all.",
    },
    "accessTokenQuery": {
        "type": "apiKey", "in": "query", "name": "access_token",
        "description": "The same credential as ?access_token=, only where a browser cannot "
                       "set headers (EventSource).",
    },
}

HEADERS = {
    "Retry-After": {"description": "seconds to wait before trying again",
                    "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "WWW-Authenticate": {"description": 'Bearer error="invalid_token"',
                         "schema": {"type": "string"}},
}
_ERROR_HEADERS = {401: ("WWW-Authenticate",), 429: ("Retry-After",), 503: ("Retry-After",)}

_BODY_ERRORS = {
    408: "the body did not arrive within [connections] body_seconds",
    413: "the body is over the size limit (GATEWAY_MAX_BODY_BYTES)",
}
_SCOPED_ERRORS = {
    401: "no credential, or an unknown, expired or revoked one",
    403: "the credential lacks the scope {scope}",
    429: "this address sent too many refused credentials: blocked for a cool-down",
    503: "this server holds too many connections",
}
_STORE_ERROR = "a store is unreachable or full"
_PARAM = re.compile(r"{([^}:]+)(?::[^}]*)?}")



def document(app: web.Application) -> dict[str, Any]:
    """The application's document, from the routes registered so far."""
    return build(app.get(ROUTE_TABLE, []))


def undescribed(app: web.Application) -> list[str]:
    """``METHOD path`` of every route registered without a description."""
    return [f"{route.method} {route.path}" for route in app.get(ROUTE_TABLE, [])
            if route.operation is None]


def build(table: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in table:
        if route.operation is not None:
            path = _PARAM.sub(r"{\1}", route.path)
            paths.setdefault(path, {})[route.method.lower()] = _operation(route, route.operation)
    return {
        "openapi": "3.1.0",
        "info": {"title": "gateway", "version": __version__,
                 "description": "The gateway's HTTP interface, built from its route table "
                                "(README.md tells the rest)."},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": {"Error": ERROR}, "securitySchemes": SECURITY_SCHEMES,
                       "headers": HEADERS},
    }


def _operation(route: Route, op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": _operation_id(route),
        "summary": op.summary,
        "tags": [op.tag or _tag(route.path)],
        "parameters": _parameters(route, op),
        "responses": _responses(route, op),
        "security": _security(route),
    }
    if op.description:
        out["description"] = op.description
    if op.signed:
        out["description"] = (op.description + "\n\n" if op.description else "") + (
            "No credential: the signature is checked instead ("
            + ", ".join(op.signed) + ").")
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required,
                              "content": {op.body_media: {"schema": dict(op.body)}}}
    return out


def _operation_id(route: Route) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", _PARAM.sub(r"\1", route.path)).strip("_")
    return f"{route.method.lower()}_{words or 'root'}"


def _tag(path: str) -> str:
    parts = [p for p in path.split("/") if p and not p.startswith("{")]
    if parts[:1] == ["v1"]:
        parts = parts[1:]
    return parts[0] if parts else "pages"


def _parameters(route: Route, op: Operation) -> list[dict[str, Any]]:
    declared = {(p.where, p.name): p for p in op.params}
    params = []
    for name in _PARAM.findall(route.path):
        given = declared.pop(("path", name), None)
        params.append({"name": name, "in": "path", "required": True,
                       "description": given.description if given else name,
                       "schema": dict(given.schema) if given else {"type": "string"}})
    for p in declared.values():
        params.append({"name": p.name, "in": p.where, "required": p.required,
                       "description": p.description, "schema": dict(p.schema)})
    return params


def _security(route: Route) -> list[dict[str, list[str]]]:
    if route.scope == PUBLIC:
        return []
    found = [{"bearer": [route.scope]}]
    if route.query_token:
        found.append({"accessTokenQuery": [route.scope]})
    return found


def _responses(route: Route, op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {str(status): _answer(answer) for status, answer in op.answers.items()}
    errors: dict[int, list[str]] = {}
    for status, when in op.errors.items():
        errors.setdefault(status, []).append(when)
    guard = dict(_BODY_ERRORS) if op.body is not None or route.method != "GET" else {}
    if route.scope != PUBLIC:
        guard.update({status: text.format(scope=route.scope)
                      for status, text in _SCOPED_ERRORS.items()})
    for status, when in guard.items():
        errors.setdefault(status, []).append(when)
    if op.stores:
        errors.setdefault(503, []).append(_STORE_ERROR)
    for status in sorted(errors):
        response: dict[str, Any] = {
            "description": "; ".join(errors[status]),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        if status in _ERROR_HEADERS:
            response["headers"] = {name: {"$ref": f"#/components/headers/{name}"}
                                   for name in _ERROR_HEADERS[status]}
        out[str(status)] = response
    return out


def _answer(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"description": answer.description}
    if answer.media:
        out["content"] = {answer.media: {"schema": dict(answer.schema or {})}}
    if answer.headers:
        out["headers"] = {name: {"$ref": f"#/components/headers/{name}"}
                          for name in answer.headers}
    return out
