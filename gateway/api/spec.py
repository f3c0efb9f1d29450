"""What a route says about itself: a small declarative ``Operation`` given to
``gateway.api.routes`` with the handler (``routes.get(app, path, handler, scope=...,
doc=Operation(...))``), from which ``gateway.api.openapi`` builds the OpenAPI 3.1 document.

Why beside the handler and not in a file of its own: a description written apart drifts from
the code; one passed where the route is registered is read by the same change that alters
the route, and a route registered without one is named by ``tests/api/test_openapi.py``.
An operation lists what is particular to its route: the request, the answers, the errors
its handler raises. What the route guard adds to every route (401/403/429 for a credential,
413/408 for a body, 503 when a store is down) the document adds from the route's scope.
Schemas are plain JSON Schema (2020-12, the dialect of OpenAPI 3.1), built with the small
helpers below so that a description stays a few lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Schema = Mapping[str, Any]


def obj(required: Mapping[str, Schema] | None = None,
        optional: Mapping[str, Schema] | None = None, *, more: bool = False,
        description: str = "") -> dict[str, Any]:
    """An object with these ``required`` and ``optional`` properties; ``more``: other
    properties may appear too (a map, or an object that may grow)."""
    schema: dict[str, Any] = {"type": "object",
                              "properties": {**(required or {}), **(optional or {})}}
    if required:
        schema["required"] = list(required)
    if not more:
        schema["additionalProperties"] = False
    if description:
        schema["description"] = description
    return schema


def mapping(values: Schema, description: str = "") -> dict[str, Any]:
    """An object used as a map: any keys, each value of ``values``."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": dict(values)}
    if description:
        schema["description"] = description
    return schema


def string(description: str = "", **constraints: Any) -> dict[str, Any]:
    return _typed("string", description, constraints)


def integer(description: str = "", **constraints: Any) -> dict[str, Any]:
    return _typed("integer", description, constraints)


def number(description: str = "", **constraints: Any) -> dict[str, Any]:
    return _typed("number", description, constraints)


def boolean(description: str = "") -> dict[str, Any]:
    return _typed("boolean", description, {})


def array(items: Schema, description: str = "", **constraints: Any) -> dict[str, Any]:
    return _typed("array", description, {"items": dict(items), **constraints})


def one_of(*values: str, description: str = "", **constraints: Any) -> dict[str, Any]:
    return _typed("string", description, {"enum": list(values), **constraints})


def nullable(schema: Schema) -> dict[str, Any]:
    """``schema`` or null (JSON Schema's list of types)."""
    kind = schema.get("type")
    if kind is None:
        return {"anyOf": [dict(schema), {"type": "null"}]}
    kinds = kind if isinstance(kind, list) else [kind]
    widened = dict(schema, type=[*kinds, "null"])
    if "enum" in widened:
        widened["enum"] = [*widened["enum"], None]
    return widened


def _typed(kind: str, description: str, constraints: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": kind, **constraints}
    if description:
        schema["description"] = description
    return schema


ANY_JSON: Schema = {"description": "any JSON value"}


@dataclass(frozen=True)
class Param:
    """A query, header or path parameter. Path parameters are found in the path itself
    (a string each); one is declared only to say more about it."""

    name: str
    schema: Schema
    description: str
    where: Literal["query", "header", "path"] = "query"
    required: bool = False


@dataclass(frozen=True)
class Answer:
    """A success answer: what it means, its body's schema and media type, and the response
    headers it carries (names from ``gateway.api.openapi.HEADERS``)."""

    description: str
    schema: Schema | None = None
    media: str = "application/json"
    headers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Operation:
    """One route's description.

    ``answers``: success status → ``Answer``. ``errors``: status → when the handler answers
    it; every error body is ``{"error": code, "detail": text}`` (``gateway.api.errors``).
    ``body``: the schema of a JSON request body (``body_required``: whether it may be left
    out). ``signed``: header names of a signature the handler checks itself (webhooks: the
    route needs no credential, the signature is its credential). ``stores``: the handler
    uses a store, so it may answer 503 when one is down."""

    summary: str
    answers: Mapping[int, Answer]
    errors: Mapping[int, str] = field(default_factory=dict)
    body: Schema | None = None
    body_required: bool = True
    body_media: str = "application/json"
    params: tuple[Param, ...] = ()
    description: str = ""
    tag: str = ""
    signed: tuple[str, ...] = ()
    stores: bool = True


@dataclass(frozen=True)
class Route:
    """One registered route as the document sees it (``gateway.api.routes`` records it)."""

    method: str
    path: str
    scope: str
    query_token: bool
    operation: Operation | None
