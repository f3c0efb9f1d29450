"""The Lua scripts on a real redis-durable: priority order, dedup, leases, fencing, retries,
reclaim, dead letters, SCRIPT FLUSH."""

from __future__ import annotations

import json
import random

import pytest
import redis

from gateway import keys
from gateway.pipeline import queue
from gateway.pipeline.scripts import scripts_for
from gateway.pipeline.stages import (
    EPOCH_MS,
    PRIORITY_BASE,
    TYPE_BONUS,
    dead_key,
    deadline_key,
    delayed_key,
    inflight_key,
    meta_key,
    ready_class_key,
    ready_keys,
    seen_key,
)
from gateway.pipeline.status import document, job_status, queue_depths, ready_items
from tests.helpers import registry_violations, wait_until
from tests.pipeline.helpers import queue_add, store_reclaimed

DOC = {"text": "hello"}


async def test_enqueue_dedups_per_item_for_seven_days(runtime):
    durable = runtime.durable
    window = 7 * 24 * 3600 * 1000
    assert await queue.enqueue(durable, "a", DOC) is True
    assert await queue.enqueue(durable, "a", DOC) is False
    # Completed items stay deduplicated: the seen entry outlives the queue entry.
    await durable.hdel(meta_key(), "a")
    await durable.delete(*ready_keys("store"))
    assert await queue.enqueue(durable, "a", DOC) is False
    first_seen = int(await durable.hget(seen_key("a"), "a"))
    # Still inside the window by a second: a duplicate, and first-seen does not move.
    await durable.hset(seen_key("a"), "a", first_seen - window + 1000)
    assert await queue.enqueue(durable, "a", DOC) is False
    assert int(await durable.hget(seen_key("a"), "a")) == first_seen - window + 1000
    # Outside the window by a millisecond: the item is new again, seen from now.
    await durable.hset(seen_key("a"), "a", first_seen - window - 1)
    assert await queue.enqueue(durable, "a", DOC) is True
    assert int(await durable.hget(seen_key("a"), "a")) >= first_seen
    assert await registry_violations(durable, "durable") == []


async def test_bad_priority_or_type_is_refused_before_redis(runtime):
    with pytest.raises(ValueError):
        await queue.enqueue(runtime.durable, "x", DOC, priority="urgent")
    with pytest.raises(ValueError):
        await queue.enqueue(runtime.durable, "x", DOC, doc_type="pdf")
    assert await runtime.durable.dbsize() == 0


async def test_pop_order_equals_seed_formula(runtime):
    """Enqueue times are simulated by shifting the EPOCH argument: a score computed with
    EPOCH - d equals one computed d ms later, so items 'enqueued' hours apart need no wait.
    They are ADDed in order of their simulated enqueue time, as real time would (each
    priority class is a FIFO list), with priorities and types drawn at random."""
    durable = runtime.durable
    rng = random.Random(7)
    add = scripts_for(durable).add
    items = []
    drawn = [(f"i{i}", rng.choice(list(PRIORITY_BASE)), rng.choice(list(TYPE_BONUS)),
              rng.randrange(0, 48 * 3600 * 1000))  # enqueued up to 48 h later
             for i in range(40)]
    for item_id, priority, doc_type, offset_ms in sorted(drawn, key=lambda d: d[3]):
        k, a = queue.add_call(item_id, DOC, priority, doc_type)
        a[7] = str(EPOCH_MS - offset_ms)
        assert await add(keys=k, args=a) == 1
        items.append((item_id, PRIORITY_BASE[priority], TYPE_BONUS[doc_type], offset_ms))
    now_s = 1e9  # any instant after all enqueues: `now` cancels between items

    def formula(item):
        _, base, bonus, offset_ms = item
        enqueued_s = offset_ms / 1000
        return base - 0.001 * (now_s - enqueued_s) - bonus

    expected = [it[0] for it in sorted(items, key=formula)]
    popped = []
    while (lease := await queue.fetch(durable, "store", "w", 60_000)) is not None:
        popped.append(lease.item_id)
    assert popped == expected


async def test_add_trims_expired_entries_of_a_bucket_past_64_and_keeps_it_small(runtime):
    """A bucket of up to 64 entries keeps its dead ones (bounded: 64 per bucket); past that
    each ADD samples 8 entries and deletes the expired ones among them."""
    durable = runtime.durable
    bucket = seen_key("a")
    # Items that share a's bucket (the bucket is a pure function of the id).
    mates = [f"m{i}" for i in range(200_000) if seen_key(f"m{i}") == bucket][:66]
    assert len(mates) == 66
    old = int((await durable.time())[0]) * 1000 - 7 * 24 * 3600 * 1000 - 5000
    await durable.hset(bucket, mapping={m: old for m in mates[:64]})
    assert await queue.enqueue(durable, mates[64], DOC) is True  # 64 entries: no sample
    assert await durable.hlen(bucket) == 65
    assert await queue.enqueue(durable, mates[65], DOC) is True  # 65: 8 of them, 7 or 8 dead
    assert 58 <= await durable.hlen(bucket) <= 59
    assert await queue.enqueue(durable, "a", DOC) is True
    live = await durable.hmget(bucket, ["a", *mates[64:]])
    assert all(v is not None for v in live)
    assert await durable.object("encoding", bucket) == "listpack"
    assert await registry_violations(durable, "durable") == []


async def test_complete_moves_through_all_stages_and_drops_payload_at_the_end(runtime):
    """The payload stays until the item leaves the pipeline (``recover --reset`` may have to
    run its store stage again after a restore), then goes with its meta; FETCH hands it to
    the store stage only (the others read what store wrote)."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC, priority="high", doc_type="code")
    for stage in ("store", "chunk", "embed", "graph"):
        lease = await queue.fetch(durable, stage, "w1", 60_000)
        assert lease is not None and lease.item_id == "a"
        assert lease.document == (DOC if stage == "store" else None)
        assert await document(durable, "a") == DOC
        assert (lease.base, lease.bonus) == (50, 3)
        assert await queue.complete(durable, lease) is queue.LeaseResult.OK
    assert await durable.hlen(meta_key()) == 0
    assert await document(durable, "a") is None
    depths = await queue_depths(durable)
    assert all(v == 0 for s in depths["stages"].values() for v in s.values())


async def test_only_the_token_holder_acts(runtime):
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    lease = await queue.fetch(durable, "store", "w1", 60_000)
    assert lease is not None
    forged = queue.LeasedItem(**{**lease.__dict__, "token": "not-mine"})
    assert await queue.heartbeat(durable, forged, 60_000) is queue.LeaseResult.NOT_OWNER
    assert await queue.complete(durable, forged) is queue.LeaseResult.NOT_OWNER
    out = await queue.fail(durable, forged, "x", max_failures=3)
    assert out.result is queue.LeaseResult.NOT_OWNER
    assert await queue.heartbeat(durable, lease, 60_000) is queue.LeaseResult.OK
    assert await queue.complete(durable, lease) is queue.LeaseResult.OK
    # Once completed, nobody holds it any more: a retried COMPLETE is refused, not repeated.
    assert await queue.complete(durable, lease) is queue.LeaseResult.NOT_LEASED
    assert len(await ready_items(durable, "chunk")) == 1


async def test_one_complete_call_for_a_batch_answers_per_item(runtime):
    """A FETCH's batch is completed by one script call: each item goes to its own class in
    the next stage, in priority order, and an item whose lease was lost meanwhile is refused
    alone (its answer in its place, the others completed)."""
    durable = runtime.durable
    await queue.enqueue(durable, "low", DOC)
    await queue.enqueue(durable, "crit", DOC, priority="critical", doc_type="api_docs")
    await queue.enqueue(durable, "mid", DOC, priority="high")
    leases = await queue.fetch_many(durable, "store", "w1", 60_000, 3)
    assert [lease.item_id for lease in leases] == ["crit", "mid", "low"]
    await durable.hdel(inflight_key("store"), "mid")  # its lease is gone (as if reclaimed)
    assert await queue.complete_many(durable, leases) == [
        queue.LeaseResult.OK, queue.LeaseResult.NOT_LEASED, queue.LeaseResult.OK]
    assert await ready_items(durable, "chunk") == ["crit", "low"]
    assert await durable.llen(ready_class_key("chunk", 5)) == 1  # critical - api_docs
    assert await queue.complete_many(durable, leases) == [queue.LeaseResult.NOT_LEASED] * 3


async def test_zombie_complete_after_reclaim_is_refused(runtime):
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    zombie = await queue.fetch(durable, "store", "w1", 1)  # 1 ms lease: expired at once
    assert zombie is not None
    await wait_until(lambda: store_reclaimed(durable, 3), message="reclaim of the expired lease")
    fresh = await queue.fetch(durable, "store", "w2", 60_000)
    assert fresh is not None and fresh.item_id == "a" and fresh.reclaims == 1
    assert fresh.base == 10  # reclaimed items come back with base 10 ...
    assert fresh.priority_base == 100  # ... and keep the priority they were submitted with
    assert await queue.complete(durable, zombie) is queue.LeaseResult.NOT_OWNER
    assert await queue.heartbeat(durable, zombie, 60_000) is queue.LeaseResult.NOT_OWNER
    assert len(await ready_items(durable, "chunk")) == 0
    assert await queue.complete(durable, fresh) is queue.LeaseResult.OK
    assert await ready_items(durable, "chunk") == ["a"]
    later = await queue.fetch(durable, "chunk", "w2", 60_000)
    assert later is not None and (later.base, later.priority_base) == (10, 100)


async def test_meta_written_before_the_priority_field_still_reads(runtime):
    """Items queued by the earlier meta layout (no priority field) keep working: their
    priority is their base, and their payload is found."""
    durable = runtime.durable
    await durable.hset(meta_key(), "old", 'store|q|50|3|0|0|{"text": "a|b"}')
    await durable.rpush(ready_class_key("store", 47), "1.000000|old")  # high, code
    lease = await queue.fetch(durable, "store", "w", 60_000)
    assert lease is not None and lease.item_id == "old"
    assert (lease.base, lease.bonus, lease.priority_base) == (50, 3, 50)
    assert lease.document == {"text": "a|b"}
    assert await queue.complete(durable, lease) is queue.LeaseResult.OK
    assert (await durable.hget(meta_key(), "old")) == 'chunk|q|50|3|0|0|50|{"text": "a|b"}'


async def test_fail_backs_off_then_dead_letters(runtime):
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    lease = await queue.fetch(durable, "store", "w1", 60_000)
    out = await queue.fail(durable, lease, "boom", max_failures=2, backoff_ms=60_000)
    assert out.result is queue.LeaseResult.OK and not out.dead
    ready_at = int(await durable.zscore(delayed_key("store"), "a"))
    time_s, time_us = await durable.time()
    now_ms = time_s * 1000 + time_us // 1000
    assert now_ms + 25_000 <= ready_at <= now_ms + 60_000  # half fixed, half jitter
    assert await queue.fetch(durable, "store", "w1", 60_000) is None  # not due yet
    assert (await job_status(runtime, "a"))["stages"]["store"] == "retrying"
    await durable.zadd(delayed_key("store"), {"a": 0})  # make it due
    again = await queue.fetch(durable, "store", "w1", 60_000)
    assert again is not None and again.failures == 1
    out = await queue.fail(durable, again, "boom twice", max_failures=2)
    assert out.dead
    entries = [json.loads(e) for e in await durable.lrange(dead_key("store"), 0, -1)]
    assert entries[0]["item_id"] == "a" and entries[0]["reason"] == "boom twice"
    status = await job_status(runtime, "a")
    assert status == {"item_id": "a", "state": "dead",
                      "stages": {"store": "dead", "chunk": "pending", "embed": "pending",
                                 "graph": "pending"}}


async def test_reclaim_dead_letters_after_max_reclaims(runtime):
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    for round_ in range(3):
        lease = await queue.fetch(durable, "store", f"w{round_}", 1)
        assert lease is not None and lease.reclaims == round_
        await wait_until(lambda: store_reclaimed(durable, 2), message="reclaim")
    assert await durable.llen(dead_key("store")) == 1
    assert await durable.zcard(deadline_key("store")) == 0
    assert await durable.hlen(keys.q("lease", "store")) == 0


async def test_reclaim_is_bounded_per_call(runtime):
    durable = runtime.durable
    for i in range(25):
        await queue.enqueue(durable, f"i{i}", DOC)
        assert await queue.fetch(durable, "store", "w", 1) is not None
    await wait_until(lambda: _all_expired(durable), message="leases expired")
    back, dead, more = await queue.reclaim(durable, "store", max_reclaims=3, batch=10)
    assert (back, dead, more) == (10, 0, True)
    totals = await queue.reclaim_all(durable, max_reclaims=3, batch=10)
    assert totals["store"] == (15, 0)
    assert len(await ready_items(durable, "store")) == 25


async def _all_expired(durable) -> bool:
    time_s, time_us = await durable.time()
    now_ms = time_s * 1000 + time_us // 1000
    return await durable.zcount(deadline_key("store"), now_ms + 1, "+inf") == 0


async def test_add_in_a_caller_pipeline_with_a_claim(runtime):
    durable = runtime.durable
    for expected in ([True, 1], [None, 0]):
        async with durable.pipeline(transaction=False) as pipe:
            pipe.set(keys.dedup_job("j1"), "in-progress", nx=True, ex=60)
            await queue_add(pipe, "j1", DOC, priority="critical")
            assert await pipe.execute() == expected
    assert len(await ready_items(durable, "store")) == 1


async def test_script_flush_mid_run_reloads(runtime):
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    lease = await queue.fetch(durable, "store", "w", 60_000)
    await durable.script_flush()
    assert await queue.complete(durable, lease) is queue.LeaseResult.OK
    await durable.script_flush()
    async with durable.pipeline(transaction=False) as pipe:
        await queue_add(pipe, "b", DOC)
        assert await pipe.execute() == [1]
    await durable.script_flush()
    assert await queue.enqueue(durable, "c", DOC) is True
    assert await queue.fetch(durable, "chunk", "w", 60_000) is not None


async def test_batched_fetch_merges_the_class_lists_in_score_order(runtime):
    """One FETCH of several items takes them from several class lists in score order and
    leaves the rest queued, best first."""
    durable = runtime.durable
    order = [("n1", "normal", "other"), ("c1", "critical", "code"), ("h1", "high", "api_docs"),
             ("n2", "normal", "api_docs"), ("c2", "critical", "other"), ("h2", "high", "other")]
    for item_id, priority, doc_type in order:
        assert await queue.enqueue(durable, item_id, DOC, priority=priority,
                                   doc_type=doc_type) is True
    expected = ["c1", "c2", "h1", "h2", "n2", "n1"]  # by base - bonus, then enqueue time
    assert await ready_items(durable, "store") == expected
    first = await queue.fetch_many(durable, "store", "w", 60_000, 4)
    assert [lease.item_id for lease in first] == expected[:4]
    assert await ready_items(durable, "store") == expected[4:]
    assert (await queue_depths(durable))["stages"]["store"]["ready"] == 2
    rest = await queue.fetch_many(durable, "store", "w", 60_000, 64)
    assert [lease.item_id for lease in rest] == expected[4:]
    assert await durable.exists(*ready_keys("store")) == 0


async def test_batched_fetch_keeps_within_its_byte_bound(runtime):
    """With ``max_bytes`` a FETCH stops before the item that would pass the bound (which
    stays first in line); the first item is taken whatever its size."""
    durable = runtime.durable
    sizes = {"a": 1000, "b": 1000, "c": 1000, "big": 5000, "d": 10}
    for item_id, size in sizes.items():
        assert await queue.enqueue(durable, item_id, {"text": "x" * size})
    payload = {i: len(json.dumps({"text": "x" * n}, separators=(",", ":")))
               for i, n in sizes.items()}
    two = payload["a"] + payload["b"]
    first = await queue.fetch_many(durable, "store", "w", 60_000, 32, max_bytes=two)
    assert [lease.item_id for lease in first] == ["a", "b"]
    assert await ready_items(durable, "store") == ["c", "big", "d"]
    assert [lease.item_id for lease in await queue.fetch_many(
        durable, "store", "w", 60_000, 32, max_bytes=two)] == ["c"]  # big would pass it
    alone = await queue.fetch_many(durable, "store", "w", 60_000, 32, max_bytes=two)
    assert [lease.item_id for lease in alone] == ["big"]  # larger than the bound: alone
    assert alone[0].document == {"text": "x" * 5000}
    rest = await queue.fetch_many(durable, "store", "w", 60_000, 32)
    assert [lease.item_id for lease in rest] == ["d"]


async def test_fetch_skips_a_stale_ready_entry(runtime):
    """An entry whose meta no longer says "queued in this stage" is dropped, not leased."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    await queue.enqueue(durable, "b", DOC)
    raw = await durable.hget(meta_key(), "a")
    await durable.hset(meta_key(), "a", raw.replace("store|q|", "chunk|q|", 1))
    lease = await queue.fetch(durable, "store", "w", 60_000)
    assert lease is not None and lease.item_id == "b"
    assert await durable.hget(meta_key(), "a") == raw.replace("store|q|", "chunk|q|", 1)
    assert await ready_items(durable, "store") == []


async def test_equal_scores_across_classes_pop_the_lower_class_first(runtime):
    """An exact tie between two classes goes to the more urgent class, in FETCH and in
    ``ready_items`` alike (not to the smaller item id, as a sorted set would)."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC, priority="high")  # class 50
    await queue.enqueue(durable, "z", DOC, priority="high", doc_type="code")  # class 47
    await durable.delete(*ready_keys("store"))
    await durable.rpush(ready_class_key("store", 50), "60.000000|a")
    await durable.rpush(ready_class_key("store", 47), "60.000000|z")
    assert await ready_items(durable, "store") == ["z", "a"]
    leases = await queue.fetch_many(durable, "store", "w", 60_000, 2)
    assert [lease.item_id for lease in leases] == ["z", "a"]


async def test_complete_with_a_wrong_class_list_changes_nothing(runtime):
    """COMPLETE resolves the next stage's class list before writing: a caller passing the
    wrong one gets an error and the item stays leased (RECLAIM would return it)."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC, priority="high")
    lease = await queue.fetch(durable, "store", "w", 60_000)
    assert lease is not None
    keys, args = queue.complete_call("store", "a", lease.token, 97)
    with pytest.raises(redis.exceptions.ResponseError, match="no ready list for class"):
        await scripts_for(durable).complete(keys=keys, args=args)
    assert await durable.hexists(inflight_key("store"), "a")
    assert await queue.complete(durable, lease) is queue.LeaseResult.OK
    assert await ready_items(durable, "chunk") == ["a"]


async def test_an_item_listed_twice_is_leased_once_per_fetch(runtime):
    """FETCH reads a batch's metas in one go before it writes any: an item with a second
    (stale) entry in its list is still leased once, and the entry is dropped."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    await queue.enqueue(durable, "b", DOC)
    entry_a = (await durable.lrange(ready_class_key("store", 100), 0, 0))[0]
    await durable.rpush(ready_class_key("store", 100), entry_a)  # a, b, a again
    leases = await queue.fetch_many(durable, "store", "w", 60_000, 3)
    assert [lease.item_id for lease in leases] == ["a", "b"]
    assert await durable.hlen(inflight_key("store")) == 2
    assert await ready_items(durable, "store") == []
    assert await queue.complete_many(durable, leases) == [queue.LeaseResult.OK] * 2
    assert await ready_items(durable, "chunk") == ["a", "b"]


async def test_complete_answers_an_item_named_twice_once(runtime):
    """A COMPLETE call naming one item twice completes it once: the second answer is
    NOT_LEASED, as if the two were sent one after the other."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    await queue.enqueue(durable, "b", DOC)
    a, b = await queue.fetch_many(durable, "store", "w", 60_000, 2)
    assert await queue.complete_many(durable, [a, b, a]) == [
        queue.LeaseResult.OK, queue.LeaseResult.OK, queue.LeaseResult.NOT_LEASED]
    assert await ready_items(durable, "chunk") == ["a", "b"]
    assert await durable.hget(keys.q("stats", "store"), "completed") == "2"
    assert await durable.hget(keys.q("stats", "chunk"), "enqueued") == "2"


async def test_a_wrong_class_fails_the_whole_batch_without_writes(runtime):
    """Every check of a batched COMPLETE comes before its first write: one item whose class
    has no list in the call leaves every item of the batch leased and untouched."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC)
    await queue.enqueue(durable, "b", DOC)
    leases = await queue.fetch_many(durable, "store", "w", 60_000, 2)
    raw = await durable.hget(meta_key(), "b")
    await durable.hset(meta_key(), "b", raw.replace("|100|0|", "|100|1|", 1))  # no class 99
    with pytest.raises(redis.exceptions.ResponseError, match="no ready list for class"):
        await queue.complete_many(durable, leases)
    assert await durable.hlen(inflight_key("store")) == 2
    assert await durable.zcard(deadline_key("store")) == 2
    assert await ready_items(durable, "chunk") == []
    assert (await durable.hget(meta_key(), "a")).startswith("store|r|")
    assert await durable.hget(keys.q("stats", "store"), "completed") is None


async def test_batches_past_luas_unpack_limit(runtime):
    """FETCH and COMPLETE pass a batch's items to one command each, in parts of at most
    4,000 arguments (Lua's unpack stops at 8,000 values): a batch of 2,500 items (5,000
    field-value arguments) is leased and completed whole."""
    durable = runtime.durable
    async with durable.pipeline(transaction=False) as pipe:
        for i in range(2500):
            await queue_add(pipe, f"i{i:04d}", DOC)
        await pipe.execute()
    leases = await queue.fetch_many(durable, "store", "w", 60_000, 3000)
    assert [lease.item_id for lease in leases] == [f"i{i:04d}" for i in range(2500)]
    assert await durable.hlen(inflight_key("store")) == 2500
    assert await queue.complete_many(durable, leases) == [queue.LeaseResult.OK] * 2500
    assert await durable.hlen(inflight_key("store")) == 0
    assert await durable.llen(ready_class_key("chunk", 100)) == 2500
    assert (await ready_items(durable, "chunk"))[:2] == ["i0000", "i0001"]


async def test_metas_from_before_priority_was_kept(runtime):
    """A meta written before it kept the submitted priority has one field less (its payload
    '' or JSON): FETCH reads its priority as its base and COMPLETE writes it in today's
    layout, its payload kept."""
    durable = runtime.durable
    await queue.enqueue(durable, "a", DOC, priority="high", doc_type="code")
    await queue.enqueue(durable, "b", DOC, priority="high", doc_type="code")
    await durable.hset(meta_key(), mapping={"a": 'store|q|50|3|2|1|{"text":"hello"}',
                                            "b": "store|q|50|3|0|0|"})
    a, b = await queue.fetch_many(durable, "store", "w", 60_000, 2)
    assert (a.item_id, a.document, a.base, a.bonus, a.failures, a.reclaims,
            a.priority_base) == ("a", DOC, 50, 3, 2, 1, 50)
    assert (b.item_id, b.document, b.priority_base) == ("b", None, 50)
    assert await durable.hget(meta_key(), "a") == 'store|r|50|3|2|1|50|{"text":"hello"}'
    assert await queue.complete_many(durable, [a, b]) == [queue.LeaseResult.OK] * 2
    assert await durable.hmget(meta_key(), ["a", "b"]) == [
        'chunk|q|50|3|0|0|50|{"text":"hello"}', "chunk|q|50|3|0|0|50|"]
    assert await ready_items(durable, "chunk") == ["a", "b"]


async def test_heartbeat_and_release_of_a_batch_answer_per_item(runtime):
    """One HEARTBEAT call extends every lease of a FETCH's batch its token still holds and
    answers per item; one RELEASE call gives the held ones back, untouched, in their order."""
    durable = runtime.durable
    for item_id in ("a", "b", "c"):
        await queue.enqueue(durable, item_id, DOC)
    leases = await queue.fetch_many(durable, "store", "w", 1_000, 3)
    before = dict(await durable.zrange(deadline_key("store"), 0, -1, withscores=True))
    await durable.hdel(inflight_key("store"), "b")  # lost meanwhile (as if reclaimed)
    assert await queue.heartbeat_many(durable, leases, 600_000) == [
        queue.LeaseResult.OK, queue.LeaseResult.NOT_LEASED, queue.LeaseResult.OK]
    after = dict(await durable.zrange(deadline_key("store"), 0, -1, withscores=True))
    assert after["a"] >= before["a"] + 599_000 and after["c"] >= before["c"] + 599_000
    assert after["b"] == before["b"]  # not extended: its lease is gone
    assert await queue.release_many(durable, leases) == [
        queue.LeaseResult.OK, queue.LeaseResult.NOT_LEASED, queue.LeaseResult.OK]
    assert await ready_items(durable, "store") == ["a", "c"]
    assert await durable.hlen(inflight_key("store")) == 0
    again = await queue.fetch_many(durable, "store", "w", 60_000, 3)
    assert [(lease.item_id, lease.failures, lease.reclaims) for lease in again] == [
        ("a", 0, 0), ("c", 0, 0)]
