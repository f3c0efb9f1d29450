"""The key registry: every Redis key and channel the gateway uses, and the only
place that builds them.

A key that matches no row here is a bug; ``tests/test_registry_scenario.py`` scans both
instances after a full scenario to prove it. Keys that one Lua script touches together share
a hash tag so the scripts also run on Redis Cluster.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

Instance = Literal["durable", "cache"]

# Every pipeline key carries this hash tag: ADD/FETCH/COMPLETE/... touch several stages at once.
PIPELINE_TAG = "{pipeline}"
# Every inbox key carries this one: TAKE/ACK/RECLAIM touch a platform's sets and chat lists.
INBOX_TAG = "{inbox}"
# How many candidate tags ``shard_tag`` tries for a shard: the nearest of 512 lands within
# ~16 slots of its target.
_TAG_CANDIDATES = 512


@lru_cache(maxsize=256)
def shard_tag(tag: str, index: int, count: int) -> str:
    """The hash tag of shard ``index`` of ``count`` for the keys tagged ``tag`` (``{pipeline}``,
    ``{inbox}``). Shard 0 keeps ``tag`` itself, so one shard is today's layout exactly and the
    keys written before sharding are shard 0's. Shard i > 0 is ``{<name>:<i>:<k>}`` with the
    smallest ``k`` whose Redis Cluster slot is nearest to shard 0's slot + i/count of the slot
    space: the shards' slots are evenly spaced, so on a cluster whose masters own equal
    contiguous slot ranges (``redis-cli --cluster create``) a shard count that is a multiple of
    the masters puts the same number of shards on each (docs/architecture.md, 3.4)."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count}")
    if index == 0:
        return tag
    name = tag.strip("{}")
    target = (key_slot(tag.encode()) + index * REDIS_CLUSTER_HASH_SLOTS // count) \
        % REDIS_CLUSTER_HASH_SLOTS

    def distance(candidate: str) -> int:
        apart = abs(key_slot(candidate.encode()) - target)
        return min(apart, REDIS_CLUSTER_HASH_SLOTS - apart)

    return min((f"{{{name}:{index}:{k}}}" for k in range(_TAG_CANDIDATES)), key=distance)


def shard_tags(tag: str, count: int) -> tuple[str, ...]:
    """Every shard's tag, shard 0 (``tag``) first."""
    return tuple(shard_tag(tag, index, count) for index in range(count))


def shard_index(ident: str, count: int) -> int:
    """The shard an item or chat id belongs to: a stable hash (BLAKE2b, not the CRC-32 that
    picks a pipeline item's dedup bucket, so the two choices are independent)."""
    if count <= 1:
        return 0
    digest = hashlib.blake2b(ident.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass(frozen=True)
class Row:
    namespace: str
    purpose: str
    instance: Instance
    ttl: str
    owner: str
    kind: Literal["key", "channel"] = "key"

    @property
    def must_expire(self) -> bool:
        """Every key in redis-cache carries a TTL; so do dedup claims and leases."""
        return self.kind == "key" and (
            self.instance == "cache" or self.namespace.startswith(
                ("dedup:", "lock:", "brute:", "bl:", "grace:", "sync:"))
        )


REGISTRY: tuple[Row, ...] = (
    Row("q:", "pipeline queues, leases, delayed retries, dead letters, payloads (until an "
        "item leaves), the dedup window, stats",
        "durable", "until completion", "pipeline"),
    Row("inbox:", "per-chat inbound queues of chat messages: ready chats, chat leases, "
        "per-chat entry lists, dead letters", "durable", "until processed", "inbox"),
    Row("rl:", "rate-limit state (sliding-window logs and their totals, concurrency slots, "
        "a provider's cool-down after its 429)", "durable", "the window (a cool-down: its "
        "Retry-After)", "ratelimit"),
    Row("brute:", "per-IP failure barrier on bad signatures / bad secrets",
        "durable", "the window", "security"),
    Row("bl:", "revoked access-token ids (jti), per-account not-before marks, revoked API "
        "keys, refresh families revoked for theft, per-account chat-link removals", "durable",
        "the token's remaining lifetime", "access"),
    Row("grace:", "refresh-rotation grace: a just-spent refresh token -> its new pair",
        "durable", "10 s", "access"),
    Row("sync:", "a short-lived write per Redis Cluster primary that WAITAOF waits on "
        "(durable acks on a cluster)", "durable", "10 s", "stores"),
    Row("lock:", "single-holder leases with fencing token (Mattermost listener, maintenance, "
        "notification partitions and their members)",
        "durable", "lease", "runs"),
    Row("dedup:webhook:", "one inbound webhook delivery, one processing",
        "durable", "24 h (GATEWAY_DEDUP_TTL)", "webhooks"),
    Row("dedup:webhook-body:", "one signed body per source -> its first delivery id (replay "
        "window of schemes that sign no timestamp: GitHub)", "durable",
        "7 d for github ([webhooks.<source>] replay_window_seconds)", "webhooks"),
    Row("dedup:slack-event:", "one Slack event_id, one answer", "durable", "24 h", "slack"),
    Row("dedup:telegram-update:", "one Telegram update_id per bot, one answer",
        "durable", "24 h", "telegram"),
    Row("dedup:job:", "one job_id enqueue, one run", "durable", "24 h (GATEWAY_DEDUP_TTL)",
        "pipeline"),
    Row("dedup:mattermost-post:", "one Mattermost post id, one answer", "durable", "24 h",
        "mattermost"),
    Row("cache:", "response and search-candidate cache", "cache", "per key (+LRU)", "cache"),
    Row("cache:mattermost:listener", "listener heartbeat JSON; expired = not running",
        "cache", "90 s", "mattermost"),
    Row("telegram:active-conv:", "pointer to a Telegram chat's active conversation",
        "cache", "sliding, conversation idle time", "telegram"),
    Row("slack:active-conv:", "pointer to a Slack channel/thread's active conversation",
        "cache", "sliding, conversation idle time", "slack"),
    Row("mattermost:active-conv:", "pointer to a Mattermost channel's active conversation",
        "cache", "sliding, conversation idle time", "mattermost"),
    Row("push:", "pub/sub signal of a new feed row (a channel, not a key)",
        "cache", "ephemeral", "push", kind="channel"),
)

_BY_PREFIX = sorted(REGISTRY, key=lambda row: len(row.namespace), reverse=True)


def row_for(key: str) -> Row | None:
    """The registry row a key or channel belongs to (most specific namespace wins)."""
    for row in _BY_PREFIX:
        if key == row.namespace or (row.namespace.endswith(":") and key.startswith(row.namespace)):
            return row
    return None


def _join(namespace: str, *parts: object) -> str:
    if not parts:
        raise ValueError(f"{namespace} key needs at least one part")
    return namespace + ":".join(map(str, parts))  # map: no generator frame (hot path)


# --- durable -----------------------------------------------------------------------------

def q(*parts: object, tag: str = PIPELINE_TAG) -> str:
    """A pipeline key: ``q:<tag>:<parts>``; one hash tag for every key of a shard
    (``{pipeline}``: shard 0, ``shard_tag``)."""
    return _join("q:", tag, *parts)


def inbox(platform: str, *parts: object, tag: str = INBOX_TAG) -> str:
    """An inbox key: ``inbox:<tag>:<platform>:<parts>``; one hash tag for every key of a
    shard (``{inbox}``: shard 0, ``shard_tag``)."""
    return _join("inbox:", tag, platform, *parts)


def rl(*parts: object) -> str:
    return _join("rl:", *parts)


def brute(*parts: object) -> str:
    return _join("brute:", *parts)


def revoked_jti(jti: str) -> str:
    return _join("bl:", "jti", jti)


def revoked_key(key_id: str) -> str:
    """An API key revoked (PostgreSQL has it too; this is what every request checks)."""
    return _join("bl:", "key", key_id)


def revoked_before(sub: str) -> str:
    """Tokens of ``sub`` issued before the value (Unix seconds) are refused."""
    return _join("bl:", "sub", sub)


def revoked_family(family: str) -> str:
    """A refresh family revoked for theft: the access tokens it issued are refused too."""
    return _join("bl:", "fam", family)


def unlinked(sub: str) -> str:
    """A chat link of ``sub`` was removed (a new random value each time): every process drops
    the link grants it keeps for that account, so streams reading through it end."""
    return _join("bl:", "link", sub)


def refresh_grace(token_hash: str) -> str:
    return _join("grace:", token_hash)


def sync_barrier(tag: object) -> str:
    """``sync:{<tag>}``: the tag picks the cluster slot, hence the primary, it lands on."""
    return f"sync:{{{tag}}}"


def owner_namespace(sub: str) -> str:
    """An account's namespace (``u.<16 hex of sha256(sub)>``): the prefix of the job ids it
    submits, hence of their ``q:`` and ``dedup:job:`` keys, and the account its usage rows
    name, so its chats and its jobs count as one account against a budget."""
    return "u." + hashlib.sha256(sub.encode()).hexdigest()[:16]  # any sub, fixed size


def key_namespace(key_id: str) -> str:
    """An API key's namespace (``k.<key id>``), as ``owner_namespace`` is an account's."""
    return f"k.{key_id}"


_OWNED = re.compile(r"^(k\.[0-9a-f]+|u\.[0-9a-f]{16})/")


def item_owner(item_id: str) -> str | None:
    """The namespace an owned job's item id (``<namespace>/<job id>``) starts with, or None
    (the admin's jobs, webhooks)."""
    match = _OWNED.match(item_id)
    return match.group(1) if match else None


# The namespace of what the admin token submits (its job ids are bare): the operators'.
OPERATOR_NAMESPACE = "ops"
WEBHOOK_ITEM_PREFIX = "webhook:"


def webhook_namespace(source: str) -> str:
    """A webhook source's namespace (``src.<source>``): the owner of the documents its
    deliveries bring."""
    return f"src.{source}"


def document_owner(item_id: str) -> str:
    """The namespace an item's document belongs to, read from its item id: an owned job's
    (``k.<key id>/...``, ``u.<hash>/...``) is its submitter's, a webhook's
    (``webhook:<source>:<delivery id>``) its source's, any other (the admin token's bare
    job ids) the operators'. Migration 0017 applies the same rule in SQL to the documents
    stored before owners were."""
    owner = item_owner(item_id)
    if owner is not None:
        return owner
    if item_id.startswith(WEBHOOK_ITEM_PREFIX):
        source = item_id[len(WEBHOOK_ITEM_PREFIX):].partition(":")[0]
        if source:
            return webhook_namespace(source)
    return OPERATOR_NAMESPACE


def lock(name: str) -> str:
    return _join("lock:", name)


def dedup_webhook(source: str, delivery_id: str) -> str:
    return f"dedup:webhook:{source}:{delivery_id}"  # both given: not _join (ingest path)


def dedup_webhook_body(source: str, body_digest: str) -> str:
    return _join("dedup:webhook-body:", source, body_digest)


def dedup_slack_event(event_id: str) -> str:
    return _join("dedup:slack-event:", event_id)


def dedup_telegram_update(bot_id: int | str, update_id: int | str) -> str:
    return _join("dedup:telegram-update:", bot_id, update_id)


def dedup_job(job_id: str) -> str:
    return _join("dedup:job:", job_id)


def dedup_mattermost_post(post_id: str) -> str:
    return _join("dedup:mattermost-post:", post_id)


# --- cache -------------------------------------------------------------------------------

def cache(*parts: object) -> str:
    return _join("cache:", *parts)


def mattermost_listener() -> str:
    return "cache:mattermost:listener"


def telegram_active_conv(chat_id: int | str) -> str:
    return _join("telegram:active-conv:", chat_id)


def slack_active_conv(team_id: str, channel: str, thread_ts: str | None = None) -> str:
    return _join("slack:active-conv:", team_id, channel, thread_ts or "-")


def mattermost_active_conv(channel_id: str, root_id: str | None = None) -> str:
    return _join("mattermost:active-conv:", channel_id, root_id or "-")


def push_channel(topic: str) -> str:
    return _join("push:", topic)


def table() -> list[tuple[str, str, str, str, str]]:
    """Rows for ``gateway keys``: namespace first."""
    return [(r.namespace, r.instance, r.ttl, r.owner, r.purpose) for r in REGISTRY]
