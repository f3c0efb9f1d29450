"""redis-py's asyncio cluster client, with the gaps the gateway hits closed so that code
written against a single instance runs unchanged on Redis Cluster:

- ``register_script`` on a cluster *pipeline* fails (it has no encoder), and a script called
  with ``client=pipeline`` is never loaded first: the non-cluster Pipeline runs ``SCRIPT
  EXISTS``/``SCRIPT LOAD`` before it executes, the cluster one does not, so the first batch
  after a start or a ``SCRIPT FLUSH`` fails with NOSCRIPT. Here scripts queued on a cluster
  pipeline are loaded (on every primary) before it executes, as on a single instance.
- ``pubsub()`` on a client that has not run a command yet has no slot map, and the first
  ``SUBSCRIBE``/``SSUBSCRIBE`` fails with ``KeyError``/``SlotNotCoveredError``. Here the
  pubsub loads the slot map first.
- concurrent first commands on a fresh client race its initialisation (see execute_command).

Everything else is redis-py's own ``RedisCluster``; ``isinstance(x, RedisCluster)`` holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio.cluster import ClusterPipeline, ClusterPubSub, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException


class ClusterScript(AsyncScript):
    """A script that, called on a cluster pipeline, is loaded before the pipeline runs."""

    async def __call__(self, keys: Sequence[Any] | None = None,
                       args: Iterable[Any] | None = None, client: Any = None) -> Any:
        if isinstance(client, GatewayClusterPipeline):
            keys = list(keys or [])
            client.scripts.add(self)
            # ``evalsha`` is blocked on cluster pipelines (a NOSCRIPT inside one could not be
            # cured); the raw command is not, and the pipeline loads the script first.
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *(args or []))
        return await super().__call__(keys, args, client)


async def load_scripts(client: RedisCluster, scripts: Iterable[AsyncScript]) -> None:
    """SCRIPT EXISTS on every primary, SCRIPT LOAD (to every primary) what is missing."""
    pending = list(scripts)
    if not pending:
        return
    present = await client.script_exists(*(s.sha for s in pending))
    for script, exists in zip(pending, present, strict=True):
        if not exists:
            script.sha = await client.script_load(script.script)


class GatewayClusterPipeline(ClusterPipeline):
    """A cluster pipeline that accepts registered scripts like a single-instance one."""

    def __init__(self, client: RedisCluster, transaction: bool | None = None) -> None:
        super().__init__(client, transaction)
        self.scripts: set[AsyncScript] = set()

    def get_encoder(self) -> Any:
        return self.cluster_client.get_encoder()

    def register_script(self, script: Any) -> Any:
        return self.cluster_client.register_script(script)

    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        try:
            await load_scripts(self.cluster_client, self.scripts)
            return await super().execute(raise_on_error, allow_redirections)
        finally:
            self.scripts.clear()

    async def reset(self) -> Any:
        self.scripts.clear()
        await super().reset()


class InitializingClusterPubSub(ClusterPubSub):
    """A cluster pubsub that loads the slot map before its first command."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.cluster.initialize()
        return await super().execute_command(*args, **kwargs)

    async def ssubscribe(self, *args: Any, **kwargs: Any) -> None:
        await self.cluster.initialize()
        await super().ssubscribe(*args, **kwargs)


class GatewayCluster(RedisCluster):
    """``RedisCluster`` whose pipelines run registered scripts and whose pubsub works on a
    client that has not connected yet."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # redis-py resolves the command's routing policy *before* it initializes, so the
        # first commands of a fresh client, sent concurrently, can use a connection that
        # initialize() is closing ("'NoneType' object has no attribute 'writelines'").
        # Initialising first (a flag check once done) closes that race.
        await self.initialize()
        return await super().execute_command(*args, **kwargs)

    def register_script(self, script: Any) -> Any:
        return ClusterScript(self, script)

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> GatewayClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return GatewayClusterPipeline(self, transaction)  # type: ignore[abstract]

    def pubsub(self, node: Any = None, host: str | None = None, port: int | None = None,
               **kwargs: Any) -> InitializingClusterPubSub:
        return InitializingClusterPubSub(self, node=node, host=host, port=port, **kwargs)
