"""Search and embedding benchmark, in one invocation on embedded servers:

- **search**: nearest-chunk queries at ``--sizes`` chunks (10k and 100k), pgvector's HNSW
  index against the float8[] scan (a second database migrated with ``gateway.pgvector =
  off``) on the same vectors: p50/p99 latency of ``vectors.nearest`` (the SQL the search route
  runs, through asyncpg), HNSW's recall@10 against the exact scan, and the local model's
  query-embedding time (what a search adds before the SQL). Vectors are 256-dimensional,
  clustered like text embeddings, written with COPY (binary) so that data generation takes
  seconds.
- **modes**: at each size, with 100 words of a made-up Zipf vocabulary per chunk (its
  tsvector, the GIN index) and the chunks spread over 10 owners, p50/p99 of
  ``ranking.ranked`` in each mode (vector, text, hybrid: both lists fused by reciprocal
  rank, in one statement) and of hybrid as two statements fused in the process
  (``ranking.two_lists``, the baseline), the query's vector given (the SQL and the fusion
  are timed, not the model), reading every chunk (the admin) and reading one owner's tenth
  (the owner filter inside the SQL).
- **recall@5** on a generated question set (``--questions`` documents about made-up people,
  companies, places and codes; three questions each, in other words, naming one of them),
  through the local model and the default stage handlers, per mode.
- **embed stage**: documents of this repository's own prose (~700-character chunks) through
  the real embed-stage worker (lease, handler, vectors written, journal, feed row, COMPLETE),
  in chunks per second, against the local model called directly on the same chunks (the
  faster of one call per document and one call for all).

    python bench/search.py [--sizes 10000,100000] [--queries 200] [--scan-queries 20]
                           [--documents 4000] [--per-doc 4] [--concurrency 8] [--batch 64]
                           [--rounds 3] [--questions 300]
                           [--parts search,modes,recall,embed]   (--sizes "": the embed
                           stage only; --questions 0: no recall run; --parts: only those)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from stores import embedded_runtime, run_in_tempdir

from gateway.app.worker import run_workers
from gateway.knowledge import embedding, ranking, text, vectors
from gateway.knowledge.owners import EVERYTHING, Readable
from gateway.knowledge.stages import split_text
from gateway.pipeline import queue
from gateway.pipeline.stages import stats_key
from gateway.pipeline.worker import WorkerConfig
from gateway.stores.migrate import migrate_url
from gateway.stores.runtime import Runtime, open_runtime
from tests.knowledge import questions
from tests.knowledge.indexing import index_many

ROOT = Path(__file__).resolve().parent.parent
DIMS = 256
MODEL = f"bench:clustered@{DIMS}"
K = 10


def clustered(count: int, seed: int) -> np.ndarray:
    """Unit vectors around count/50 random centres (text embeddings cluster by topic)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(1, count // 50), DIMS)).astype(np.float32)
    rows = centres[rng.integers(0, len(centres), count)]
    rows += 0.6 * rng.normal(size=(count, DIMS)).astype(np.float32)
    return embedding.normalise(rows)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


OWNERS = 10  # chunks spread over this many owners; a tenant reads one of them


class Words:
    """A made-up vocabulary with Zipf frequencies, like a language's: a few words in most
    chunks, most words in few."""

    def __init__(self, size: int = 20_000, seed: int = 5) -> None:
        rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        self.words = ["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(size)]
        weights = 1.0 / np.arange(1, size + 1)
        self.p = weights / weights.sum()
        self.rng = rng

    def texts(self, rows: int, count: int) -> list[str]:
        """``rows`` texts of ``count`` words each (drawn at once: one call per text is slow
        at 100k)."""
        drawn = self.rng.choice(len(self.words), size=(rows, count), p=self.p)
        return [" ".join(self.words[i] for i in row) for row in drawn]


async def load(rt: Runtime, rows: np.ndarray, words: Words | None = None) -> float:
    """Replace every chunk by ``rows`` (COPY), with ``words``' text (100 words a chunk, its
    tsvector, ``OWNERS`` owners round robin) when given; seconds taken."""
    pgvector = (await vectors.layout(rt)).pgvector
    started = time.perf_counter()
    await rt.pg.execute("TRUNCATE pipeline_chunks")
    await rt.pg.execute(f"DROP INDEX IF EXISTS {vectors.index_name(MODEL)}")
    vectors.forget()
    bodies = words.texts(len(rows), 100) if words else [""] * len(rows)
    records = ((f"c{i}", 0, body, row if pgvector else row.tolist(), MODEL, f"k.{i % OWNERS}")
               for i, (row, body) in enumerate(zip(rows, bodies, strict=True)))
    await rt.pg.copy_records_to_table(
        "pipeline_chunks",
        columns=["item_id", "seq", "body", "embedding", "embedder", "owner"],
        records=records, timeout=600)
    if words:
        await rt.pg.execute("UPDATE pipeline_chunks SET tsv = to_tsvector('simple', body)",
                            timeout=600)
    await rt.pg.execute("VACUUM ANALYZE pipeline_chunks", timeout=600)
    text.forget_common()
    return time.perf_counter() - started


async def time_modes(rt: Runtime, queries: np.ndarray, words: Words,
                     readable: Readable) -> dict[str, list[float]]:
    """Latency of each mode (``ranking.ranked`` with the query's vector given, so the SQL
    and the fusion are timed, not the model) on 4-word queries, interleaved."""
    latencies: dict[str, list[float]] = {mode: [] for mode in (*ranking.MODES, TWO)}
    for i, (query, said) in enumerate(zip(queries, words.texts(len(queries), 4),
                                          strict=True)):
        # The two ways of hybrid take turns going first: the first reads the pages the
        # query needs from the OS cache into shared buffers for the other.
        for mode in (*ranking.MODES, TWO) if i % 2 else (*ranking.MODES[:2], TWO, "hybrid"):
            started = time.perf_counter()
            if mode == TWO:
                await ranking.two_lists(rt, said, (query, MODEL), K, readable)
            else:
                await ranking.ranked(rt, said, K, readable, mode, embedded=(query, MODEL))
            latencies[mode].append(time.perf_counter() - started)
    return latencies


TWO = "hybrid as two statements"  # the baseline: ranking.two_lists


async def recall(rt: Runtime, count: int) -> dict[str, float]:
    """recall@5 per mode on the generated question set (``tests/knowledge/questions.py``:
    documents about made-up names, three questions each in other words), the documents
    written by the default stage handlers with the local model."""
    await rt.pg.execute("TRUNCATE pipeline_chunks, pipeline_documents")
    docs = questions.documents(count)
    for start in range(0, count, 100):
        await index_many(rt, [(d.item_id, {"text": d.text, "title": d.title})
                              for d in docs[start:start + 100]])
    await rt.pg.execute("ANALYZE pipeline_chunks")
    text.forget_common()
    asked = questions.questions(docs)
    found = {}
    for mode in ranking.MODES:
        hits = 0
        for question in asked:
            best = await ranking.ranked(rt, question.text, 5, EVERYTHING, mode)
            hits += question.item_id in [h.item_id for h in best]
        found[mode] = hits / len(asked)
    return found


async def time_queries(rt: Runtime, queries: np.ndarray) -> tuple[list[float], list[list[str]]]:
    latencies, found = [], []
    for query in queries:
        started = time.perf_counter()
        rows = await vectors.nearest(rt, query, MODEL, K, EVERYTHING, timeout=300)
        latencies.append(time.perf_counter() - started)
        found.append([r["item_id"] for r in rows])
    return latencies, found


async def search_at(hnsw: Runtime, scan: Runtime | None, size: int, n_queries: int,
                    n_scan: int, modes: bool) -> dict[str, Any]:
    """At ``size`` chunks: HNSW against the scan (``scan``; None: not run) and each mode
    (``modes``)."""
    corpus = clustered(size, seed=size)
    noise = np.random.default_rng(1).normal(size=(n_queries, DIMS)).astype(np.float32)
    queries = embedding.normalise(corpus[:n_queries] + 0.5 * noise / np.sqrt(DIMS))
    words = Words()
    load_s = await load(hnsw, corpus, words)
    started = time.perf_counter()
    await vectors.ensure_index(hnsw, MODEL, DIMS)
    found: dict[str, Any] = {"size": size, "load_s": load_s,
                             "build_s": time.perf_counter() - started}
    if scan is not None:
        await load(scan, corpus)
        await time_queries(hnsw, queries[:20])  # warm the index pages and the plan
        hnsw_lat, hnsw_found = await time_queries(hnsw, queries)
        await time_queries(scan, queries[:2])
        scan_lat, scan_found = await time_queries(scan, queries[:n_scan])
        found["recall"] = statistics.mean(
            len(set(a) & set(b)) / K for a, b in zip(hnsw_found, scan_found, strict=False))
        found.update(hnsw=hnsw_lat, scan=scan_lat)
    if modes:
        await time_modes(hnsw, queries[:20], words, EVERYTHING)  # warm
        found["modes"] = {}
        for reader, readable in (("everything", EVERYTHING),
                                 ("one owner", Readable.of("k.3", ()))):
            found["modes"][reader] = (await time_modes(hnsw, queries, words, readable),
                                      os.getloadavg()[0])
    return found


def prose() -> list[str]:
    """This repository's documentation, as chunks of the chunk stage's size."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    text += "\n\n" + (ROOT / "README.md").read_text()
    return [c for c in split_text(text) if len(c) > 400]


def direct(texts: list[str], per_doc: int) -> tuple[float, float]:
    """Seconds for the model called directly: one call for every text (``embed_now``: runs
    of 8, by length; the fastest way to call it), and one call per document."""
    model = embedding.local()
    started = time.perf_counter()
    model.embed_now(texts)
    at_once = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, len(texts), per_doc):
        model.embed_now(texts[start:start + per_doc])
    return at_once, time.perf_counter() - started


async def embed_stage(rt: Runtime, texts: list[str], per_doc: int, concurrency: int,
                      batch: int = 8) -> float:
    """Seconds for the embed-stage workers to embed ``texts`` (``per_doc`` per document)."""
    documents = len(texts) // per_doc
    await rt.durable.flushall()
    await rt.pg.execute("TRUNCATE pipeline_chunks, pipeline_documents, pipeline_journal, "
                        "feed, feed_topics")
    await rt.pg.copy_records_to_table(
        "pipeline_chunks", columns=["item_id", "seq", "body", "owner"],
        records=[(f"d{i // per_doc}", i % per_doc, t, "ops") for i, t in enumerate(texts)])
    for d in range(documents):
        await queue.enqueue_at(rt.durable, f"d{d}", "embed", priority="normal",
                               doc_type="other")
    stop = asyncio.Event()
    config = WorkerConfig(lease=90, heartbeat=30, reclaim_interval=60, idle_max=0.05,
                          batch=batch)
    started = time.perf_counter()
    task = asyncio.create_task(run_workers(rt, stop, stages=("embed",), config=config,
                                           concurrency=concurrency))
    while int(await rt.durable.hget(  # noqa: ASYNC110 -- polling is the measurement here
            stats_key("embed"), "completed") or 0) < documents:
        await asyncio.sleep(0.01)
    stage_s = time.perf_counter() - started
    stop.set()
    await task
    done = await rt.pg.fetchval("SELECT count(*) FROM pipeline_chunks WHERE embedder IS NOT NULL")
    assert done == len(texts), done
    return stage_s


async def query_embedding(count: int) -> list[float]:
    """The local model embedding one query on its thread, as search does."""
    model = embedding.local()
    texts = [c[:80] for c in prose()][:count]
    latencies = []
    for said in texts:
        started = time.perf_counter()
        await model.embed([said])
        latencies.append(time.perf_counter() - started)
    return latencies


async def _scan_runtime(hnsw: Runtime) -> Runtime:
    """A second database on the same server, migrated with ``gateway.pgvector = off``."""
    assert hnsw.settings.database_url
    url = urlunsplit(urlsplit(hnsw.settings.database_url)._replace(path="/bench_scan"))
    await hnsw.pg.execute("CREATE DATABASE bench_scan")
    await hnsw.pg.execute("ALTER DATABASE bench_scan SET gateway.pgvector = 'off'")
    # The HNSW build at 100k wants more than the default 64 MB (the graph fits in memory).
    database = await hnsw.pg.fetchval("SELECT current_database()")
    await hnsw.pg.execute(f"ALTER DATABASE {database} SET maintenance_work_mem = '512MB'")
    await hnsw.pg.expire_connections()
    await migrate_url(url)
    return await open_runtime(replace(hnsw.settings, database_url=url))


async def run(args: argparse.Namespace, root: Path) -> None:
    async with embedded_runtime(root) as hnsw:
        scan = await _scan_runtime(hnsw)
        try:
            await measure(hnsw, scan if "search" in args.parts else None, args)
        finally:
            await scan.close()


async def measure(hnsw: Runtime, scan: Runtime | None, args: argparse.Namespace) -> None:
    print(f"load at start {os.getloadavg()[0]:.2f}; pgvector "
          f"{(await vectors.layout(hnsw)).version}, {DIMS} dimensions, top-{K}; parts "
          + ",".join(args.parts))
    for size in args.sizes if {"search", "modes"} & set(args.parts) else ():
        r = await search_at(hnsw, scan, size, args.queries, args.scan_queries,
                            "modes" in args.parts)
        print(f"{size:>7} chunks (COPY {r['load_s']:.1f} s, HNSW build {r['build_s']:.1f} s)")
        if scan is not None:
            h50, h99 = percentile(r["hnsw"], 0.5) * 1e3, percentile(r["hnsw"], 0.99) * 1e3
            s50, s99 = percentile(r["scan"], 0.5) * 1e3, percentile(r["scan"], 0.99) * 1e3
            print(f"  hnsw  p50 {h50:8.2f} ms  p99 {h99:8.2f} ms  ({len(r['hnsw'])} queries,"
                  f" recall@{K} {r['recall']:.3f})"
                  f"\n  scan  p50 {s50:8.2f} ms  p99 {s99:8.2f} ms  ({len(r['scan'])} queries)"
                  f"\n  scan/hnsw p50 {s50 / h50:.0f}x  p99 {s99 / h99:.0f}x"
                  f"   load {os.getloadavg()[0]:.2f}")
        for reader, (modes, load_after) in r.get("modes", {}).items():
            line = ", ".join(f"{mode} p50 {percentile(lat, 0.5) * 1e3:.2f} / p99 "
                             f"{percentile(lat, 0.99) * 1e3:.2f} ms"
                             for mode, lat in modes.items())
            p99 = {mode: percentile(lat, 0.99) for mode, lat in modes.items()}
            print(f"  modes, reading {reader} (1/{OWNERS} of the chunks for one owner): "
                  f"{line}; p99 hybrid/vector x{p99['hybrid'] / p99['vector']:.2f}, "
                  f"hybrid/two statements x{p99['hybrid'] / p99[TWO]:.2f}"
                  f"   load {load_after:.2f}")
    if args.questions and "recall" in args.parts:
        found = await recall(hnsw, args.questions)
        print(f"recall@5 on {3 * args.questions} generated questions ({args.questions} "
              "documents about made-up names): " + ", ".join(
                  f"{mode} {value:.3f}" for mode, value in found.items())
              + f"; hybrid/vector x{found['hybrid'] / found['vector']:.2f}"
              f"   load {os.getloadavg()[0]:.2f}")
    if "embed" in args.parts:
        await embed_part(hnsw, args)


async def embed_part(hnsw: Runtime, args: argparse.Namespace) -> None:
    """The query embedding's time and the embed stage against the model called directly."""
    q = await query_embedding(200)
    print(f"query embedding (local model, its thread): p50 "
          f"{percentile(q, 0.5) * 1e3:.2f} ms  p99 {percentile(q, 0.99) * 1e3:.2f} ms")
    pool = prose()
    texts = [pool[i % len(pool)] for i in range(args.documents * args.per_doc)]
    embedding.local().embed_now(texts[:64])  # the model loaded outside the timings
    stage_runs, direct_runs = [], []
    for _ in range(args.rounds):  # interleaved, best of each: the machine is shared
        direct_runs.append(direct(texts, args.per_doc))
        stage_runs.append(await embed_stage(hnsw, texts, args.per_doc, args.concurrency,
                                            args.batch))
    stage_s = min(stage_runs)
    at_once, per_document = (min(runs) for runs in zip(*direct_runs, strict=True))
    n = len(texts)
    print(f"embed stage: {n} chunks, {args.per_doc} per document, concurrency "
          f"{args.concurrency}, batch {args.batch}, best of {args.rounds}: "
          f"{n / stage_s:.0f} chunks/s ({stage_s:.2f} s); model directly, one call "
          f"{n / at_once:.0f} chunks/s (ratio {at_once / stage_s:.2f}), one call per "
          f"document {n / per_document:.0f} chunks/s (ratio {per_document / stage_s:.2f})"
          f"   load {os.getloadavg()[0]:.2f}")


PARTS = ("search", "modes", "recall", "embed")


def _parts(text: str) -> list[str]:
    parts = [p for p in text.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        raise argparse.ArgumentTypeError(f"parts are some of {', '.join(PARTS)}")
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--scan-queries", type=int, default=20)
    parser.add_argument("--documents", type=int, default=4000)
    parser.add_argument("--per-doc", type=int, default=4, help="chunks per document")
    parser.add_argument("--concurrency", type=int, default=8, help="embed loops")
    parser.add_argument("--rounds", type=int, default=3, help="embed: runs of each")
    parser.add_argument("--batch", type=int, default=64, help="embed: items per transaction")
    parser.add_argument("--questions", type=int, default=300,
                        help="documents of the recall@5 question set (0: none)")
    parser.add_argument("--parts", type=_parts, default=list(PARTS),
                        help=f"comma-separated, of {','.join(PARTS)} (default: all)")
    run_in_tempdir(run, parser.parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
