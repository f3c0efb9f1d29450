"""The pipeline over several hash tags (``GATEWAY_PIPELINE_SHARDS``): every item in the
shard its id hashes to for its whole life, every shard served by every worker, priority
exact within a shard, stages in order per item, and what one shard (today's ``{pipeline}``
keys) holds served once there are more."""

from __future__ import annotations

from dataclasses import replace

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from gateway import keys
from gateway.config import Settings
from gateway.pipeline import deadletter, queue, shards
from gateway.pipeline.queue import Quota
from gateway.pipeline.stages import STAGES, meta_key
from gateway.pipeline.status import job_status, queue_depths
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations, wait_until
from tests.pipeline.helpers import workers

SHARDS = 3


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return replace(settings, pipeline_shards=SHARDS)


def shard_of(item: str) -> str:
    return shards.item_tag(item, SHARDS)


async def drain_stage(runtime: Runtime, stage: str) -> list[queue.LeasedItem]:
    """Fetch batches of up to 4 until the stage is empty; each batch completed in one call
    (one script call per batch, in the batch's shard)."""
    taken = []
    while leases := await queue.fetch_many(runtime.durable, stage, "w", 60_000, 4):
        assert len({lease.tag for lease in leases}) == 1  # a batch comes from one shard
        taken += leases
        assert await queue.complete_many(runtime.durable, leases) == \
            [queue.LeaseResult.OK] * len(leases)
    return taken


async def test_items_spread_over_the_shards_and_keep_their_order(runtime: Runtime) -> None:
    assert shards.count_of(runtime.durable) == SHARDS  # from GATEWAY_PIPELINE_SHARDS
    items = sorted(f"doc{i}" for i in range(30))
    for i, item in enumerate(items):  # the later ones critical: they must pass the others
        assert await queue.enqueue(runtime.durable, item, {"text": item},
                                   priority="critical" if i % 5 == 4 else "normal")
    assert {shard_of(item) for item in items} == set(keys.shard_tags(keys.PIPELINE_TAG, 3))
    for item in items:  # every key of an item in its shard
        assert await runtime.durable.hexists(meta_key(shard_of(item)), item)
    if isinstance(runtime.durable, RedisCluster):  # one shard per master of three
        nodes = {runtime.durable.nodes_manager.get_node_from_slot(key_slot(meta_key(t)
                 .encode())).name for t in shards.tags_of(runtime.durable)}
        assert len(nodes) == 3
    taken = await drain_stage(runtime, "store")
    assert sorted(lease.item_id for lease in taken) == items
    firsts = [lease.tag for lease in taken[:12:4]]  # each batch of 4 from the next shard
    assert len(set(firsts)) == 3  # each fetch begins one shard further
    for tag in set(firsts):  # within a shard: exact priority order
        bases = [lease.base for lease in taken if lease.tag == tag]
        assert bases == sorted(bases)
    for stage in STAGES[1:]:  # each item moves on within its shard, one stage at a time
        moved = await drain_stage(runtime, stage)
        assert sorted(lease.item_id for lease in moved) == items
        assert all(lease.tag == shard_of(lease.item_id) for lease in moved)
    depths = await queue_depths(runtime.durable)
    assert all(sum(counts.values()) == 0 for counts in depths["stages"].values())
    assert await registry_violations(runtime.durable, "durable") == []


async def test_workers_serve_every_shard(runtime: Runtime) -> None:
    for i in range(12):
        await queue.enqueue(runtime.durable, f"w{i}", {"text": f"document {i}"})
    async with workers(runtime):
        await wait_until(lambda: _journaled(runtime, 48), timeout=30, message="48 rows")
    rows = await runtime.pg.fetch(
        "SELECT item_id, stage FROM pipeline_journal ORDER BY completed_at, stage")
    for i in range(12):  # every item's stages, in pipeline order
        assert [r["stage"] for r in rows if r["item_id"] == f"w{i}"] == list(STAGES)
    assert (await job_status(runtime, "w7"))["state"] == "done"  # type: ignore[index]


async def _journaled(runtime: Runtime, n: int) -> bool:
    return await runtime.pg.fetchval("SELECT count(*) FROM pipeline_journal") >= n


async def test_items_of_the_single_tag_are_served_after_sharding(runtime: Runtime) -> None:
    """Items added under ``{pipeline}`` alone stay in shard 0 through every stage, whatever
    shard their ids hash to now; status, dead letters and requeue find them."""
    shards.configure(runtime.durable, 1)
    old = sorted(f"old{i}" for i in range(6))
    for item in old:
        await queue.enqueue(runtime.durable, item, {"text": item})
    shards.configure(runtime.durable, SHARDS)
    assert {shard_of(item) for item in old} != {keys.PIPELINE_TAG}  # some hash elsewhere
    assert (await job_status(runtime, "old1"))["state"] == "queued"  # type: ignore[index]
    taken = await drain_stage(runtime, "store")
    assert sorted(lease.item_id for lease in taken) == old
    assert {lease.tag for lease in taken} == {keys.PIPELINE_TAG}
    [lease] = await queue.fetch_many(runtime.durable, "chunk", "w", 60_000, 1)
    assert await queue.heartbeat(runtime.durable, lease, 60_000) is queue.LeaseResult.OK
    outcome = await queue.fail(runtime.durable, lease, "boom", max_failures=1)
    assert outcome.dead
    [dead] = await deadletter.list_dead(runtime.durable, "chunk")
    assert dead["item_id"] == lease.item_id
    assert await deadletter.requeue(runtime.durable, "chunk") == [lease.item_id]
    for stage in STAGES[1:]:
        assert len(await drain_stage(runtime, stage)) == len(old)


def test_a_quota_is_kept_per_shard_with_its_share() -> None:
    """Quotas and admission limits live with the items, in each shard: each shard keeps
    ceil(limit / N) of them (an owner spread evenly gets about its whole quota)."""
    _, args = queue.add_call("k.1/a", {"text": "x"}, quota=Quota("k.1", 10, 1000),
                             shard_count=SHARDS)
    assert args[9:11] == ["4", "334"]
    keys_, args = queue.add_call("k.1/a", {"text": "x"}, quota=Quota("k.1", 10, 1000))
    assert args[9:11] == ["10", "1000"] and all(keys.PIPELINE_TAG in k for k in keys_)
    keys_, _ = queue.add_call("k.1/a", {"text": "x"}, shard_count=SHARDS)
    assert len({k.split("}")[0] for k in keys_}) == 1  # one tag: one slot per call
