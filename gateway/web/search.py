"""``GET /v1/search?q=&limit=``: ranked chunks, answers cached in redis-cache."""

from __future__ import annotations

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.state import RUNTIME
from gateway.knowledge import search as pipeline_search
from gateway.stores.runtime import Runtime


async def search(request: web.Request) -> web.Response:
    query = request.query.get("q", "").strip()
    if not query:
        raise ApiError(400, "bad_request", "q is required")
    if len(query) > pipeline_search.MAX_QUERY:
        raise ApiError(400, "bad_request", f"q is longer than {pipeline_search.MAX_QUERY}")
    try:
        limit = int(request.query.get("limit", "10"))
    except ValueError:
        raise ApiError(400, "bad_request", "limit must be an integer") from None
    if not 1 <= limit <= pipeline_search.MAX_LIMIT:
        raise ApiError(400, "bad_request", f"limit must be 1-{pipeline_search.MAX_LIMIT}")
    results = await pipeline_search.search(request.app[RUNTIME], query, limit)
    return web.json_response({"query": query, "results": results})


def setup(app: web.Application, runtime: Runtime) -> None:
    routes.get(app, "/v1/search", search, scope="search:read")
