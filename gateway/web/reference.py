"""``GET /v1/openapi.json``: the OpenAPI 3.1 document of this application, built from its
route table (``gateway.api.openapi``); ``GET /v1/docs``: a reference page rendering it with
Swagger UI, whose files come from the ``swagger-ui-py`` wheel and are served from here (no
CDN: the page works where the gateway has no way out). Both public: the document describes
the interface, not its data."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from gateway.api import openapi, routes
from gateway.api.spec import Answer, Operation, obj
from gateway.api.state import PUBLIC
from gateway.stores.runtime import Runtime

PAGE = Path(__file__).parent / "static" / "reference.html"
# Of the wheel's files, the two the page loads (the rest is an editor and source maps).
SWAGGER_FILES = frozenset({"swagger-ui-bundle.js", "swagger-ui.css"})


def swagger_ui_directory() -> Path:
    import swagger_ui  # the wheel ships Swagger UI's built files in its static folder

    return Path(swagger_ui.__file__).parent / "static"


async def reference_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache"})


DOCUMENT = Operation(
    "This OpenAPI 3.1 document", {200: Answer("the document", obj(
        {"openapi": {"type": "string"}, "info": {"type": "object"},
         "paths": {"type": "object"}}, more=True))},
    stores=False, tag="reference")
PAGE_DOC = Operation(
    "A reference page of this API (Swagger UI, served from here)",
    {200: Answer("the page", {"type": "string"}, media="text/html")},
    stores=False, tag="reference")


def setup(app: web.Application, runtime: Runtime) -> None:
    built: list[bytes] = []

    async def openapi_json(request: web.Request) -> web.Response:
        if not built:  # on the first request: every component has added its routes
            built.append(json.dumps(openapi.document(request.app)).encode())
        return web.Response(body=built[0], content_type="application/json")

    routes.get(app, "/v1/openapi.json", openapi_json, scope=PUBLIC, doc=DOCUMENT)
    routes.get(app, "/v1/docs", reference_page, scope=PUBLIC, doc=PAGE_DOC)
    routes.static(app, "/v1/docs/", swagger_ui_directory(), names=SWAGGER_FILES,
                  tag="reference")
