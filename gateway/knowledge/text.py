"""Full-text search over chunks: the words of the query matched against each chunk's
``tsvector`` (migration 0020, a GIN index), ranked by ``ts_rank_cd``.

``[search] language`` (default ``simple``) is the text search configuration the chunk stage
writes ``tsv`` in and the query is read in; ``simple`` lower-cases and keeps every word
unstemmed, so names and codes survive. The query is the OR of its words (a question in other
words shares some of them with its document, seldom all), less the stop words of
``[search] stopwords`` (a configuration whose stop words are dropped from queries, default
``english``; ``""`` keeps every word), which would otherwise match nearly every chunk. The
owner filter (``owners.Readable``) is inside the statement, as for vectors.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from gateway.config import ConfigError, Settings
from gateway.knowledge.owners import Readable

# A text search configuration's name: written into SQL as a literal, so restricted.
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class TextSettings:
    language: str = "simple"
    stopwords: str = "english"  # "" keeps every word of a query


def text_settings(settings: Settings) -> TextSettings:
    """``[search] language`` and ``stopwords``, checked (names of text search
    configurations; ``stopwords`` may be empty)."""
    section = settings.section("search")
    found = TextSettings()
    values: dict[str, str] = {}
    for name, default in (("language", found.language), ("stopwords", found.stopwords)):
        value = section.get(name, default)
        if not isinstance(value, str) or not (_NAME.match(value) or (
                name == "stopwords" and value == "")):
            raise ConfigError(f"[search].{name}", "must be the name of a PostgreSQL text "
                              "search configuration (lower-case letters, digits, _)"
                              + (", or empty" if name == "stopwords" else ""))
        values[name] = value
    return TextSettings(**values)


def tsvector_sql(text: TextSettings, body: str) -> str:
    """The tsvector of the SQL expression ``body`` (the chunk stage's)."""
    return f"to_tsvector('{text.language}', {body})"


def tsquery_sql(text: TextSettings, query: str, common: str, all_common: bool = True) -> str:
    """The query of the SQL expression ``query``'s words in the configured language, its
    stop words dropped: the OR of those not in the array ``common`` (a question in other
    words shares some words with its document, seldom all); when every word is common, the
    AND of them all (OR would match nearly every chunk), or NULL when not ``all_common``;
    NULL (no match) when no word is left."""
    # A word with a quote or a backslash (which the default parser seldom keeps) would need
    # escaping in tsquery's syntax: it is left out.
    stop = (f" AND to_tsvector('{text.stopwords}', w) <> ''::tsvector"
            if text.stopwords else "")
    words = (f"SELECT w FROM unnest(tsvector_to_array(to_tsvector('{text.language}', "
             f"{query}))) AS w WHERE w !~ '[''\\\\]'{stop}")
    quoted = "'''' || w || ''''"
    return (f"(WITH words AS MATERIALIZED ({words}),"
            f" rare AS (SELECT w FROM words WHERE w <> ALL({common}))"
            " SELECT (CASE WHEN EXISTS (SELECT FROM rare)"
            f" THEN (SELECT string_agg({quoted}, ' | ') FROM rare)"
            + (f" ELSE (SELECT string_agg({quoted}, ' & ') FROM words)" if all_common else "")
            + " END)::tsquery)")


# At most this many matching chunks are ranked (ts_rank_cd reads each one's tsvector, some
# 35 us a row on this machine under load): a query whose words are in more chunks ranks the
# first ones the index yields. 500 made a broad query's ranking half its statement's time.
RANKED_MAX = 200


def matched_sql(text: TextSettings, where: str, query: str = "$1::text", limit: str = "$2",
                common: str = "$3::text[]", all_common: bool = True) -> str:
    """CTEs ``q`` (the tsquery), ``matches`` and ``matched``: rows ``(item_id, seq, body,
    owner, rank)`` of the chunks where ``where`` holds whose words match ``query``, best
    ``ts_rank_cd`` first, ``limit`` of them, the words of ``common`` left out of the query
    (``all_common``: see ``tsquery_sql``)."""
    tsquery = tsquery_sql(text, query, common, all_common)
    return (f"q AS MATERIALIZED (SELECT {tsquery} AS q),"
            " matches AS MATERIALIZED (SELECT c.item_id, c.seq, c.body, c.owner, c.tsv"
            f" FROM pipeline_chunks c, q WHERE c.tsv @@ q.q AND {where} LIMIT {RANKED_MAX}),"
            " matched AS MATERIALIZED (SELECT m.item_id, m.seq, m.body, m.owner,"
            " ts_rank_cd(m.tsv, q.q) AS rank FROM matches m, q"
            f" ORDER BY rank DESC, m.item_id, m.seq LIMIT {limit})")


def ranked_sql(text: TextSettings, readable: Readable,
               all_common: bool = True) -> tuple[str, list[Any]]:
    """``(sql, parameters after $1, $2 and $3)``: the chunks ``readable`` allows whose words
    match the query ``$1``, best ``ts_rank_cd`` first, ``$2`` of them, the words of ``$3``
    (the common ones) left out of the query (``all_common``: see ``tsquery_sql``); rows
    ``(item_id, seq, body, owner, title, url, score)`` as ``vectors.nearest_sql``'s."""
    where, params = readable.sql("c.owner", 4)
    sql = (f"WITH {matched_sql(text, where, all_common=all_common)}"
           " SELECT f.item_id, f.seq, f.body, f.owner, doc.title, doc.url, f.rank AS score"
           " FROM matched f LEFT JOIN pipeline_documents doc ON doc.item_id = f.item_id"
           " ORDER BY f.rank DESC, f.item_id, f.seq")
    return sql, params


# The planner's statistics of the chunks' words (ANALYZE, autovacuum): the most common ones
# and the share of chunks each is in.
_COMMON = """
SELECT e.word FROM pg_stats s,
    unnest(s.most_common_elems::text::text[], s.most_common_elem_freqs) AS e(word, share),
    pg_class t
WHERE s.tablename = 'pipeline_chunks' AND s.attname = 'tsv'
    AND s.schemaname = current_schema() AND t.oid = 'pipeline_chunks'::regclass
    AND e.word IS NOT NULL AND e.share > $1 AND e.share * t.reltuples > $2
"""
# A word in more than this share of the chunks, and in more than COMMON_MIN of them, says
# little of any one.
COMMON_SHARE = 0.01
COMMON_MIN = 10
COMMON_SECONDS = 60.0
_common: dict[str, tuple[float, list[str]]] = {}


async def common_words(runtime: Any) -> list[str]:
    """Words in more than ``COMMON_SHARE`` and ``COMMON_MIN`` of the chunks, by the
    planner's statistics (of
    every owner's chunks: only their frequency is used, never what they are in), read at most
    once a minute per process."""
    url = runtime.settings.database_url
    now = time.monotonic()
    found = _common.get(url)
    if found is None or now - found[0] > COMMON_SECONDS:
        words = [r["word"] for r in await runtime.pg_reads.fetch(_COMMON, COMMON_SHARE,
                                                                 COMMON_MIN)]
        found = _common[url] = (now, words)
    return found[1]


def forget_common() -> None:
    """Read the statistics again at the next search (after an ANALYZE in a test)."""
    _common.clear()


async def matching(runtime: Any, query: str, limit: int, readable: Readable,
                   timeout: float | None = None, all_common: bool = True) -> list[Any]:
    """The ``limit`` best text matches of ``query`` among the chunks ``readable`` allows
    (on the client-read pool); not ``all_common``: none for a query of common words only."""
    if readable.nothing:
        return []
    sql, params = ranked_sql(text_settings(runtime.settings), readable, all_common)
    return list(await runtime.pg_reads.fetch(sql, query, limit, await common_words(runtime),
                                             *params, timeout=timeout))
