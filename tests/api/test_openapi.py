"""The OpenAPI document (``GET /v1/openapi.json``): every route of a fully configured app is
described (a route added without ``doc=`` fails here, by name), the document is valid
OpenAPI 3.1 (``openapi-spec-validator``), public, and says what the route guard does; the
reference page (``/v1/docs``) is served with its files from here, no CDN."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from gateway.api import openapi
from gateway.api.routes import ROUTE_TABLE, UNMATCHED
from gateway.config import Secret, Settings
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app

ANONYMOUS = {"Authorization": ""}


def every_component(settings: Settings) -> Settings:
    """Settings under which every component registers all of its routes (the bots, CORS)."""
    return dataclasses.replace(
        settings, telegram_bot_token=Secret("1:telegram-token"),
        telegram_webhook_secret=Secret("telegram-secret"),
        slack_bot_token=Secret("xoxb-slack-token"), slack_signing_secret=Secret("slack-secret"),
        cors_origins=("https://app.example",), jwt_secret=Secret("j" * 40))


@pytest.fixture
async def full_app(settings: Settings, runtime: Runtime) -> AsyncIterator[web.Application]:
    rt = await open_runtime(every_component(settings))
    try:
        yield create_app(rt)
    finally:
        await rt.close()


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route aiohttp serves, but HEAD (GET's twin) and the fallback."""
    return {(route.method, route.resource.canonical) for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"
            and route.resource.canonical != "/{tail}"
            and route.handler.__name__ != UNMATCHED}


def test_every_route_is_described(full_app: web.Application) -> None:
    """Add ``doc=Operation(...)`` where the route is registered (gateway/api/spec.py;
    docs/architecture.md, "Routes describe themselves")."""
    assert openapi.undescribed(full_app) == [], "routes without a description (doc=...)"
    recorded = {(route.method, route.path) for route in full_app[ROUTE_TABLE]}
    assert served_routes(full_app) <= recorded, "routes added around gateway.api.routes"
    paths = openapi.document(full_app)["paths"]
    documented = {(method.upper(), path) for path, item in paths.items() for method in item}
    assert documented == recorded
    assert ("POST", "/telegram/webhook") in documented and ("OPTIONS", "/v1/feed") in documented


def test_the_document_is_valid_openapi_3_1(full_app: web.Application) -> None:
    document = openapi.document(full_app)
    assert document["openapi"] == "3.1.0"
    validate(document)  # raises on any departure from the 3.1 schema, $refs resolved
    for path, item in document["paths"].items():
        for method, operation in item.items():
            where = f"{method.upper()} {path}"
            assert operation["summary"] and operation["responses"], where
            declared = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert declared == set(re.findall(r"{([^}]+)}", path)), where
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, where


def test_security_and_guard_errors_follow_each_routes_scope(
        full_app: web.Application) -> None:
    paths = openapi.document(full_app)["paths"]
    assert paths["/v1/admin/queues"]["get"]["security"] == [{"bearer": ["admin"]}]
    assert paths["/v1/stream"]["get"]["security"] == [{"bearer": ["feed:read"]},
                                                      {"accessTokenQuery": ["feed:read"]}]
    jobs = paths["/v1/jobs"]["post"]
    assert jobs["security"] == [{"bearer": ["jobs:write"]}]
    assert {"200", "202", "400", "401", "403", "408", "413", "415", "429", "503"} <= set(
        jobs["responses"])
    assert "jobs:write" in jobs["responses"]["403"]["description"]
    assert jobs["responses"]["429"]["headers"] == {
        "Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    assert jobs["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "document"]
    healthz = paths["/healthz"]["get"]
    assert healthz["security"] == [] and set(healthz["responses"]) == {"200"}
    webhook = paths["/v1/webhooks/{source}"]["post"]
    assert webhook["security"] == [] and "signature" in webhook["description"]
    assert "401" in webhook["responses"]  # its own: a bad signature


async def test_the_document_and_the_reference_page_are_public(
        client: TestClient[Any, Any]) -> None:
    async with client.get("/v1/openapi.json", headers=ANONYMOUS) as response:
        assert response.status == 200
        served = await response.json()
    validate(served)
    assert served == openapi.document(client.app)
    assert "/v1/jobs/{id}" in served["paths"] and "/telegram/webhook" not in served["paths"]
    async with client.get("/v1/docs", headers=ANONYMOUS) as page:
        assert page.status == 200 and page.content_type == "text/html"
        html = await page.text()
    scripts = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert scripts and all(s.startswith("/") for s in scripts), "no file from elsewhere"
    for path in scripts:
        async with client.get(path, headers=ANONYMOUS) as asset:
            assert asset.status == 200, path
            if path.endswith("reference.js"):
                assert "/v1/openapi.json" in await asset.text()
            if path.endswith("swagger-ui-bundle.js"):
                assert "SwaggerUIBundle" in await asset.text()
    async with client.get("/v1/docs/swagger-editor.js", headers=ANONYMOUS) as other:
        assert other.status == 404  # only the page's two files of the wheel


async def test_a_route_added_without_a_description_is_named(runtime: Runtime) -> None:
    from gateway.api import routes
    from gateway.api.state import PUBLIC

    app = create_app(runtime)

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({})

    routes.get(app, "/v1/undescribed", handler, scope=PUBLIC)
    assert openapi.undescribed(app) == ["GET /v1/undescribed"]
    client = TestClient(TestServer(app))
    await client.start_server()
    try:  # the document leaves it out rather than failing
        assert "/v1/undescribed" not in (await (await client.get("/v1/openapi.json")).json())[
            "paths"]
    finally:
        await client.close()
