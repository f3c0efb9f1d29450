"""Network round trips measured from the outside: a counting TCP proxy for Redis/PostgreSQL.

``RoundTripCounter(host, port)`` listens on 127.0.0.1:<free port> and forwards every client
connection to ``host:port``. Counting rule, per client connection: a round trip begins when
the client sends bytes and either it is the connection's first send, or the server has sent
bytes since the client's previous send. Client bytes that arrive while the server has not
answered yet belong to the round trip already under way (pipelining). ``count`` is the total
over all connections; ``connections`` is how many were accepted.

What the rule sees and what it does not:

* It counts waits, not commands: a pipeline of 100 commands is one round trip; so are the
  requests of several concurrent callers sharing one connection that reach the proxy before
  the server answers. That is the true network cost, not an undercount.
* It cannot see causality. A client that keeps sending without waiting while answers stream
  back (several callers on one connection, out of phase) is charged one round trip per send
  that follows an answer, though it may not have waited for it. Server-initiated bytes (pub/sub
  messages, PostgreSQL notices and notifications) also start a new round trip at the client's
  next send.
* Connection setup (AUTH/HELLO, the PostgreSQL startup and authentication exchange) counts
  like anything else: read ``count`` before and after the part you measure.

Run ``python bench/rtt.py`` for a self-check against embedded Redis and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class RoundTripCounter:
    """``async with RoundTripCounter(host, port) as proxy:`` then connect to
    ``proxy.url_for(url)``; read ``proxy.count``."""

    def __init__(self, host: str, port: int) -> None:
        self.target_host, self.target_port = host, port
        self.host, self.port = "127.0.0.1", 0
        self.count = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # one per connection
        self._pumps: set[asyncio.Task[None]] = set()  # two per connection

    async def start(self) -> RoundTripCounter:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Stop listening and close every connection (both sides)."""
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()  # the connection's task then closes both sides and ends
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> RoundTripCounter:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def url_for(self, url: str) -> str:
        """``url`` (redis://, rediss://, postgresql://, postgres://) with host:port replaced by
        the proxy's; credentials, path, query string and fragment are kept."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{self.host}:{self.port}"))

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        writers = [client_w]
        answered = True  # the server has sent bytes since the client's last send

        async def upstream(server_w: asyncio.StreamWriter) -> None:
            nonlocal answered
            while data := await client_r.read(65536):
                if answered:
                    self.count += 1
                    answered = False
                server_w.write(data)
                await server_w.drain()

        async def downstream(server_r: asyncio.StreamReader) -> None:
            nonlocal answered
            while data := await server_r.read(65536):
                answered = True  # before forwarding: the client can only react after this
                client_w.write(data)
                await client_w.drain()

        pumps: list[asyncio.Task[None]] = []
        try:
            server_r, server_w = await asyncio.open_connection(
                self.target_host, self.target_port)
            writers.append(server_w)
            pumps = [asyncio.create_task(upstream(server_w)),
                     asyncio.create_task(downstream(server_r))]
            self._pumps.update(pumps)
            # Either side closing (or failing) ends the connection for both.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps.difference_update(pumps)
            for writer in writers:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            self._tasks.discard(task)


async def _self_check() -> None:
    import tempfile
    from pathlib import Path

    import asyncpg
    import redis.asyncio as aioredis

    from gateway.stores import embedded

    servers: list[embedded.RedisServer | embedded.PostgresServer] = []
    with tempfile.TemporaryDirectory(prefix="gwrtt-") as tmp:
        root = Path(tmp)
        try:
            redis = embedded.RedisServer("durable", root / "durable", embedded.new_password())
            pg = embedded.PostgresServer(root / "pg")
            servers += [redis.start(), pg.start()]
            async with RoundTripCounter("127.0.0.1", redis.port) as proxy:
                client = aioredis.from_url(proxy.url_for(redis.url))
                await client.ping()
                setup = proxy.count
                for i in range(100):
                    await client.set(f"rtt:{i}", i)
                print(f"redis: connection setup + PING {setup}, "
                      f"100 sequential SET {proxy.count - setup} round trips")
                before = proxy.count
                async with client.pipeline(transaction=False) as pipe:
                    for i in range(100):
                        pipe.set(f"rtt:{i}", i)
                    await pipe.execute()
                print(f"redis: one pipeline of 100 SET {proxy.count - before} round trip(s)")
                await client.aclose()
            async with RoundTripCounter("127.0.0.1", pg.port) as proxy:
                conn = await asyncpg.connect(proxy.url_for(pg.url))
                setup = proxy.count
                for _ in range(10):
                    await conn.execute("SELECT 1")
                simple = proxy.count - setup
                before = proxy.count
                for _ in range(10):
                    await conn.fetchval("SELECT 1")
                print(f"postgresql: connection setup {setup} round trips (startup + auth, "
                      f"paid once per pooled connection); 10 execute('SELECT 1') {simple}; "
                      f"10 fetchval('SELECT 1') {proxy.count - before} (the first one "
                      f"prepares the statement)")
                await conn.close()
        finally:
            embedded.stop_all(servers)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    asyncio.run(_self_check())
