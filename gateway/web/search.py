"""``GET /v1/search?q=&limit=``: ranked chunks of the documents the credential may read,
answers cached in redis-cache per reader scope.

A search that misses the cache embeds the query (a model call, perhaps a provider's) and asks
PostgreSQL for the nearest chunks (an HNSW walk, or a scan where pgvector is missing), so it
is bounded: at most ``[search] max_concurrent`` (2) such searches run at once in a process
(more are answered 503 + ``Retry-After`` at once, rather than queued onto the database pool
the feed needs too), and each one, the query's embedding included, gets
``[search] timeout_seconds`` (5; past it 503 as well, and its statement is cancelled on the
server). One credential holds at most ``[search] per_credential`` (1) of the slots at once
(``web.shares``; past it 429), so a client's flood leaves the other slots to everyone else.
A cached answer takes no slot."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.api import routes
from gateway.api.errors import ApiError
from gateway.api.spec import Answer, Operation, Param, array, integer, number, obj, string
from gateway.api.state import RUNTIME, Principal, principal_of
from gateway.config import tunables
from gateway.knowledge import ranking
from gateway.knowledge import search as pipeline_search
from gateway.knowledge.owners import EVERYTHING, Readable
from gateway.knowledge.text import text_settings
from gateway.providers import OverBudget, ProviderError
from gateway.stores.runtime import Runtime
from gateway.web.shares import Shares


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
    mode = request.query.get("mode", ranking.DEFAULT_MODE)
    if mode not in ranking.MODES:
        raise ApiError(400, "bad_request", f"mode must be one of {', '.join(ranking.MODES)}")
    runtime = request.app[RUNTIME]
    principal = principal_of(request)
    readable = reader_scope(principal)
    key, cached = await pipeline_search.lookup(runtime, query, limit, readable, mode)
    if cached is not None:
        return web.json_response({"query": query, "results": cached})
    results = await _rank(request.app[SEARCH_BUDGET], runtime, Query(query, limit, mode),
                          principal.owner, readable)
    await pipeline_search.remember(runtime, key, results)
    return web.json_response({"query": query, "results": results})


def reader_scope(principal: Principal) -> Readable:
    """The documents a credential reads: its own namespace's and those whose
    ``docs:<owner>`` topic its patterns match; the admin token every one."""
    if principal.is_admin:
        return EVERYTHING
    return Readable.of(principal.owner, principal.topics)


@dataclass(frozen=True)
class Query:
    text: str
    limit: int
    mode: str


async def _rank(budget: SearchBudget, runtime: Runtime, query: Query,
                owner: str, readable: Readable) -> list[dict[str, Any]]:
    if budget.slots.locked():
        raise ApiError(503, "busy", "too many searches at once; retry shortly",
                       {"Retry-After": str(RETRY_SECONDS)})
    with budget.shares.hold(owner, "searches"):
        return await _ranked(budget, runtime, query, readable)


async def _ranked(budget: SearchBudget, runtime: Runtime, query: Query,
                  readable: Readable) -> list[dict[str, Any]]:
    async with budget.slots:
        try:
            async with asyncio.timeout(budget.timeout):
                return await pipeline_search.rank(runtime, query.text, query.limit,
                                                  readable, budget.timeout, query.mode)
        except TimeoutError:
            raise ApiError(503, "timeout", f"the search took longer than {budget.timeout:g} s;"
                           " narrow it or retry", {"Retry-After": str(RETRY_SECONDS)}) from None
        except OverBudget:
            raise ApiError(503, "over_budget", "the embedder's daily token budget is spent",
                           {"Retry-After": str(BUDGET_RETRY_SECONDS)}) from None
        except ProviderError:
            raise ApiError(503, "embedder_unavailable", "no provider could embed the query",
                           {"Retry-After": str(RETRY_SECONDS)}) from None


RETRY_SECONDS = 2
BUDGET_RETRY_SECONDS = 300


@dataclass(frozen=True)
class SearchLimits:
    """``[search]``: positive numbers, checked when the app starts."""

    max_concurrent: int = 2
    timeout_seconds: float = 5.0
    per_credential: int = 1  # of those slots one credential may hold at once


class SearchBudget:
    def __init__(self, runtime: Runtime) -> None:
        text_settings(runtime.settings)  # [search] language and stopwords: checked at start
        limits = tunables(SearchLimits, runtime.settings, "search",
                          other=("language", "stopwords"))
        self.slots = asyncio.Semaphore(limits.max_concurrent)
        self.shares = Shares(limits.per_credential, RETRY_SECONDS)
        self.timeout = limits.timeout_seconds


SEARCH_BUDGET: web.AppKey[SearchBudget] = web.AppKey("search_budget", SearchBudget)


SEARCH = Operation(
    "Chunks of the documents the credential may read nearest to a query, best first",
    {200: Answer("the results", obj({"query": string(), "results": array(obj(
        {"item_id": string(), "text": string("the chunk"), "score": number(
            "hybrid: the reciprocal-rank fusion of both lists; vector: cosine similarity; "
            "text: ts_rank_cd"), "owner": string("the namespace the document belongs to")},
        {"title": string("the document's title, when it has one"),
         "url": string("the document's url, when it has one")}))}))},
    errors={400: f"q is missing or longer than {pipeline_search.MAX_QUERY} characters, "
                 f"limit is not a whole number 1-{pipeline_search.MAX_LIMIT}, or mode is "
                 "not one of vector, text, hybrid",
            429: "this credential already runs its share of the search slots",
            503: "too many searches at once (busy), the search took too long (timeout), or "
                 "the query could not be embedded (over_budget, embedder_unavailable)"},
    params=(Param("q", string(minLength=1, maxLength=pipeline_search.MAX_QUERY, examples=["hello"]),
                  "the query", required=True),
            Param("limit", integer(minimum=1, maximum=pipeline_search.MAX_LIMIT, default=10),
                  "how many results at most"),
            Param("mode", string(enum=list(ranking.MODES), default=ranking.DEFAULT_MODE),
                  "vector neighbours, full-text matches, or both fused by reciprocal rank")),
    tag="search")


def setup(app: web.Application, runtime: Runtime) -> None:
    app[SEARCH_BUDGET] = SearchBudget(runtime)
    routes.get(app, "/v1/search", search, scope="search:read", doc=SEARCH)
