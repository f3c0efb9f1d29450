"""``GET /v1/search?q=&limit=``: ranked chunks, answers cached in redis-cache.

A search is a scan with a dot product per chunk, so it is bounded: at most
``[search] max_concurrent`` (2) run at once in a process (more are answered 503 +
``Retry-After`` at once, rather than queued onto the database pool the feed needs too), and
each statement is cancelled after ``[search] timeout_seconds`` (5; 503 as well)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.state import RUNTIME
from gateway.knowledge import search as pipeline_search
from gateway.providers import OverBudget, ProviderError
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
    budget = request.app[SEARCH_BUDGET]
    if budget.slots.locked():
        raise ApiError(503, "busy", "too many searches at once; retry shortly",
                       {"Retry-After": str(RETRY_SECONDS)})
    async with budget.slots:
        try:
            results = await pipeline_search.search(request.app[RUNTIME], query, limit,
                                                   budget.timeout)
        except TimeoutError:
            raise ApiError(503, "timeout", f"the search took longer than {budget.timeout:g} s;"
                           " narrow it or retry", {"Retry-After": str(RETRY_SECONDS)}) from None
        except OverBudget:
            raise ApiError(503, "over_budget", "the embedder's daily token budget is spent",
                           {"Retry-After": str(BUDGET_RETRY_SECONDS)}) from None
        except ProviderError:
            raise ApiError(503, "embedder_unavailable", "no provider could embed the query",
                           {"Retry-After": str(RETRY_SECONDS)}) from None
    return web.json_response({"query": query, "results": results})


RETRY_SECONDS = 2
BUDGET_RETRY_SECONDS = 300


class SearchBudget:
    def __init__(self, runtime: Runtime) -> None:
        section = runtime.settings.section("search")
        self.slots = asyncio.Semaphore(int(section.get("max_concurrent", 2)))
        self.timeout = float(section.get("timeout_seconds", 5.0))


SEARCH_BUDGET: web.AppKey[SearchBudget] = web.AppKey("search_budget", SearchBudget)


def setup(app: web.Application, runtime: Runtime) -> None:
    app[SEARCH_BUDGET] = SearchBudget(runtime)
    routes.get(app, "/v1/search", search, scope="search:read")
