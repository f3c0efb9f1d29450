"""Property-based test: the Lua scripts against a small in-memory model (hypothesis
RuleBasedStateMachine on the real redis-durable). After every step each item is in exactly
the place the model says: a stage's ready or delayed set, a lease, a dead-letter list, or
gone (finished)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from redis.cluster import RedisCluster

from gateway.pipeline import queue
from gateway.pipeline.scripts import NAMES, source
from gateway.pipeline.stages import (
    STAGES,
    dead_key,
    delayed_key,
    inflight_key,
    meta_key,
    next_stage,
    ready_keys,
)
from gateway.pipeline.status import ready_order

ITEMS = st.sampled_from(["a", "b", "c", "d"])
STAGE = st.sampled_from(STAGES)
MAX_FAILURES = 2
MAX_RECLAIMS = 1


@dataclass
class Item:
    stage: str = "store"
    where: str = "ready"  # ready | delayed | leased | dead | done
    token: str | None = None
    expired: bool = False
    failures: int = 0
    reclaims: int = 0
    old_tokens: list[str] = field(default_factory=list)


def _client(url: str) -> Any:
    """A synchronous client on the same topology the suite runs on."""
    if url.split("://", 1)[0].endswith("+cluster"):
        return RedisCluster.from_url(url.replace("+cluster", "", 1), decode_responses=True)
    return redis.Redis.from_url(url, decode_responses=True, protocol=2)


def make_machine(url: str) -> type[RuleBasedStateMachine]:
    class Scripts(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.r = _client(url)
            self.r.flushall()
            self.s = {name: self.r.register_script(source(name)) for name in NAMES}
            self.items: dict[str, Item] = {}
            self.seen: set[str] = set()

        def teardown(self) -> None:
            self.r.close()

        def _token(self, item: Item | None, own: bool) -> str:
            if own and item is not None and item.token:
                return item.token
            if item is not None and item.old_tokens:
                return item.old_tokens[-1]
            return "bogus"

        def _expect_lease(self, item_id: str, token: str) -> int:
            item = self.items.get(item_id)
            if item is None or item.where != "leased":
                return -1
            return 1 if token == item.token else -2

        @rule(item_id=ITEMS)
        def add(self, item_id: str) -> None:
            keys, args = queue.add_call(item_id, {"text": item_id})
            expected = 0 if item_id in self.seen else 1
            assert self.s["add"](keys=keys, args=args) == expected
            if expected:
                self.seen.add(item_id)
                self.items[item_id] = Item()

        def _stage(self, data: st.DataObject, where: tuple[str, ...]) -> str:
            """Mostly a stage where something can happen, sometimes any stage."""
            busy = sorted({it.stage for it in self.items.values() if it.where in where})
            return str(data.draw(st.sampled_from(busy) if busy and data.draw(
                st.integers(0, 4)) else STAGE))

        @rule(data=st.data(), short=st.booleans())
        def fetch(self, data: st.DataObject, short: bool) -> None:
            stage = self._stage(data, ("ready", "delayed"))
            token = uuid.uuid4().hex
            keys, args = queue.fetch_call(stage, "w", token, 0 if short else 60_000)
            reply = self.s["fetch"](keys=keys, args=args)
            waiting = {i for i, it in self.items.items()
                       if it.stage == stage and it.where in ("ready", "delayed")}
            for i in waiting:
                self.items[i].where = "ready"  # due retries were promoted
            if not waiting:
                assert reply is None
                return
            # Its Redis time, then item, "base|bonus|failures|reclaims|priority|", payload.
            assert reply is not None and reply[1] in waiting
            item = self.items[reply[1]]
            head = reply[2].split("|")
            assert (int(head[2]), int(head[3])) == (item.failures, item.reclaims)
            # The payload stays until the item leaves the pipeline; FETCH hands it to the
            # store stage only.
            assert (reply[3] != "") == (stage == "store")
            if item.token:
                item.old_tokens.append(item.token)
            item.where, item.token, item.expired = "leased", token, short

        @rule(item_id=ITEMS, own=st.booleans())
        def heartbeat(self, item_id: str, own: bool) -> None:
            item = self.items.get(item_id)
            token = self._token(item, own)
            keys, args = queue.heartbeat_call(item.stage if item else "store", item_id, token,
                                              60_000)
            expected = self._expect_lease(item_id, token)
            reply = self.s["heartbeat"](keys=keys, args=args)
            if expected == 1:
                assert isinstance(reply, str) and int(reply) > 0
                assert item is not None
                item.expired = False
            else:
                assert reply == expected

        @rule(item_id=ITEMS, own=st.booleans())
        def complete(self, item_id: str, own: bool) -> None:
            item = self.items.get(item_id)
            token = self._token(item, own)
            keys, args = queue.complete_call(item.stage if item else "store", item_id, token)
            expected = self._expect_lease(item_id, token)
            assert self.s["complete"](keys=keys, args=args) == expected
            if expected == 1:
                assert item is not None
                after = next_stage(item.stage)
                item.old_tokens.append(item.token or "")
                item.token = None
                if after is None:
                    item.where = "done"
                else:
                    item.stage, item.where, item.failures, item.reclaims = after, "ready", 0, 0

        @rule(item_id=ITEMS, own=st.booleans())
        def fail(self, item_id: str, own: bool) -> None:
            item = self.items.get(item_id)
            token = self._token(item, own)
            keys, args = queue.fail_call(item.stage if item else "store", item_id, token, "x",
                                         max_failures=MAX_FAILURES, backoff_ms=0,
                                         backoff_cap_ms=0, jitter=0.5)
            expected = self._expect_lease(item_id, token)
            reply = self.s["fail"](keys=keys, args=args)
            if expected != 1:
                assert reply == expected
                return
            assert item is not None
            item.failures += 1
            item.old_tokens.append(item.token or "")
            item.token = None
            item.where = "dead" if item.failures >= MAX_FAILURES else "delayed"
            assert reply[0] == ("dead" if item.where == "dead" else "retry")

        @rule(data=st.data())
        def reclaim(self, data: st.DataObject) -> None:
            stage = self._stage(data, ("leased",))
            keys, args = queue.reclaim_call(stage, max_reclaims=MAX_RECLAIMS, batch=100)
            back = dead = 0
            for item in self.items.values():
                if item.stage == stage and item.where == "leased" and item.expired:
                    item.reclaims += 1
                    item.old_tokens.append(item.token or "")
                    item.token = None
                    if item.reclaims > MAX_RECLAIMS:
                        item.where, dead = "dead", dead + 1
                    else:
                        item.where, back = "ready", back + 1
            assert self.s["reclaim"](keys=keys, args=args) == [back, dead, 0]

        @rule(data=st.data())
        def requeue(self, data: st.DataObject) -> None:
            stage = self._stage(data, ("dead",))
            keys = [dead_key(stage), meta_key(), f"q:{{pipeline}}:stats:{stage}",
                    *ready_keys(stage)]
            reply = self.s["requeue"](keys=keys, args=["100", "0"])
            expected = {i for i, it in self.items.items()
                        if it.stage == stage and it.where == "dead"}
            assert set(reply) == expected and len(reply) == len(expected)
            for i in expected:
                item = self.items[i]
                item.where, item.failures, item.reclaims = "ready", 0, 0

        @invariant()
        def every_item_is_where_the_model_says(self) -> None:
            # Every place of every stage read once per step, in one round trip (the same
            # reads item by item made a step cost some hundred round trips).
            pipe = self.r.pipeline(transaction=False)
            for stage in STAGES:
                for k in ready_keys(stage):
                    pipe.lrange(k, 0, -1)
                pipe.zrange(delayed_key(stage), 0, -1)
                pipe.hkeys(inflight_key(stage))
                pipe.lrange(dead_key(stage), 0, -1)
            pipe.hkeys(meta_key())
            replies = iter(pipe.execute())
            found: dict[str, list[tuple[str, str]]] = {}
            for stage in STAGES:
                ready = ready_order([next(replies) for _ in ready_keys(stage)])
                delayed, leased = next(replies), next(replies)
                dead = [json.loads(e)["item_id"] for e in next(replies)]
                for where, ids in (("ready", ready), ("delayed", delayed),
                                   ("leased", leased), ("dead", dead)):
                    for item_id in ids:
                        found.setdefault(item_id, []).append((where, stage))
            in_meta = set(next(replies))
            for item_id, item in self.items.items():
                places = found.get(item_id, [])
                if item.where == "done":
                    assert places == [] and item_id not in in_meta
                else:
                    assert places == [(item.where, item.stage)], (item_id, item, places)

    return Scripts


@pytest.mark.slow
@pytest.mark.single_instance  # drives the scripts over a plain redis.Redis connection
def test_scripts_match_the_model(servers):
    machine = make_machine(servers.durable_url)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=50, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))
