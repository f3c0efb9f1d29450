"""Mattermost as a web component: the listener and the inbox consumer run inside ``gateway
serve`` and ``gateway dev`` when ``MATTERMOST_URL`` is set (``gateway listen mattermost``
runs them without the HTTP server).

Timings come from the settings (``GATEWAY_LISTENER_LEASE_SECONDS``, ``GATEWAY_DEDUP_TTL``)
and from an optional ``[mattermost]`` table in the TOML file whose keys are the fields of
``ListenerConfig`` (``health_interval = 10``, ``backoff_max = 30``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from gateway import keys
from gateway.api.state import add_readiness_check
from gateway.config import ConfigError, Settings, field_types, positive_numbers
from gateway.conversations import subscribing
from gateway.conversations.model import Incoming
from gateway.inbound.mattermost import health
from gateway.inbound.mattermost.client import MattermostClient, MattermostError, Post
from gateway.inbound.mattermost.listener import Listener, ListenerConfig
from gateway.inbox.component import PlatformInbox, refusal
from gateway.inbox.consumer import Process
from gateway.inbox.entry import Entry
from gateway.outbound.chat import register_poster
from gateway.outbound.delivery import Send
from gateway.outbound.errors import Undeliverable
from gateway.outbound.live import PlatformReply
from gateway.stores.runtime import Runtime

log = logging.getLogger("gateway.mattermost")

_TUNABLE = field_types(ListenerConfig, exclude=("url", "token"))
POST_ID = "post_id"
CREATED_AT = "create_at"


def listener_config(settings: Settings) -> ListenerConfig:
    """Build the listener's configuration; a wrong ``[mattermost]`` entry is a ConfigError."""
    if not settings.mattermost_url or not settings.mattermost_token:
        raise ConfigError("MATTERMOST_URL", "is required to run the Mattermost listener")
    values: dict[str, float | int] = {"lease_seconds": float(settings.listener_lease_seconds),
                                      "dedup_ttl": settings.dedup_ttl}
    values.update(positive_numbers(settings.section("mattermost"), _TUNABLE,
                                   "GATEWAY_CONFIG [mattermost]"))
    return ListenerConfig(url=settings.mattermost_url, token=settings.mattermost_token.get(),
                          **values)  # type: ignore[arg-type]


class MattermostBot:
    """The listener (one active replica) feeding the inbox, and the inbox's consumer (every
    replica) answering through the REST API."""

    def __init__(self, runtime: Runtime, process: Process | None = None,
                 instance: str | None = None) -> None:
        self.runtime = runtime
        self.config = listener_config(runtime.settings)
        self.inbox = PlatformInbox(runtime, "mattermost", self._sender, process)
        self.listener = Listener(runtime, self.config, self.accept, instance=instance)
        self.client: MattermostClient | None = None
        self.ready = asyncio.Event()

    async def accept(self, post: Post) -> None:
        incoming = Incoming(platform="mattermost", chat=post.channel_id,
                            thread=post.root_id or None, user_id=post.user_id,
                            user_name=post.user_name or post.user_id,
                            text=subscribing.bare_command(post.message),
                            message_id=post.id)
        route = {POST_ID: post.id, CREATED_AT: str(post.create_at)}
        pushed = await self.inbox.push(Entry(incoming, route),
                                       keys.dedup_mattermost_post(post.id))
        refused = refusal(pushed)
        if refused is not None:
            raise refused

    def _sender(self, entry: Entry, retried: bool) -> Send:
        return MattermostReply(self, entry, retried)

    async def earlier_reply(self, channel_id: str, post_id: str,
                            created_at: int) -> Post | None:
        """Our reply to ``post_id`` in the channel (posted after it), its first post (a long
        one goes on in more), if there is one."""
        assert self.client is not None
        me = self.listener.bot_user_id or str((await self.client.me())["id"])
        replies = await self.client.posts_since(channel_id, created_at - 1)
        return next((r for r in replies if r.user_id == me and r.reply_to == post_id), None)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """The consumer's REST client for as long as the block runs."""
        timeout = aiohttp.ClientTimeout(total=30, sock_connect=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            self.client = MattermostClient(self.config.url, self.config.token, http)
            self.ready.set()
            try:
                yield
            finally:
                self.ready.clear()
                self.client = None

    async def run(self, stop: asyncio.Event) -> None:
        """The listener and the consumer until ``stop`` (``gateway listen mattermost``)."""
        async with self.session():
            await asyncio.gather(self.listener.run(stop), self.inbox.consumer.run(stop))


class MattermostReply(PlatformReply):
    """One post in the channel (thread), naming the post it answers in its props, edited
    with ``PUT /posts/{id}/patch``; typing through ``POST /users/me/typing``. On a retry the
    channel shows whether (and in which post) the reply went out."""

    def __init__(self, bot: MattermostBot, entry: Entry, retried: bool) -> None:
        self.bot, self.incoming, self.retried = bot, entry.incoming, retried
        self.post_id = entry.route.get(POST_ID)
        self.created_at = int(entry.route.get(CREATED_AT) or 0)

    @property
    def client(self) -> MattermostClient:
        assert self.bot.client is not None
        return self.bot.client

    async def typing(self) -> None:
        await self.client.typing(self.incoming.chat, self.incoming.thread)

    async def post(self, text: str, *, first: bool = True) -> str:
        """A new post; on a retry, the earlier reply brought to ``text`` instead."""
        if self.retried and first and self.post_id:
            earlier = await self.bot.earlier_reply(self.incoming.chat, self.post_id,
                                                   self.created_at)
            if earlier is not None:
                log.info("mattermost post %s: answered before its holder stopped",
                         self.post_id)
                if earlier.message != text:
                    await self.edit(earlier.id, text)
                return earlier.id
        created = await self.client.create_post(self.incoming.chat, text, self.incoming.thread,
                                                reply_to=self.post_id)
        return str(created["id"])

    async def edit(self, ref: str, text: str) -> None:
        await self.client.patch_post(ref, text)


class MattermostPoster:
    """Notifications to a channel (``gateway.outbound.chat``): a post whose props carry the
    mark, which ``posted`` looks for among the bot's posts in the channel since then."""

    platform = "mattermost"
    can_look = True

    def __init__(self, bot: MattermostBot) -> None:
        self.bot = bot

    def _client(self) -> MattermostClient:
        if self.bot.client is None:
            raise RuntimeError("mattermost: not connected")
        return self.bot.client

    async def post(self, chat: str, text: str, mark: str) -> None:
        try:
            await self._client().create_post(chat, text, mark=mark)
        except MattermostError as exc:
            if exc.status in (403, 404):  # no such channel, or not a member: retrying won't do
                raise Undeliverable(str(exc)) from exc
            raise

    async def posted(self, chat: str, mark: str, since: float) -> bool:
        posts = await self._client().posts_since(chat, int(since * 1000) - 1)
        return any(post.mark == mark for post in posts)


def setup(app: web.Application, runtime: Runtime) -> None:
    """Run the listener and the consumer next to the HTTP server when ``MATTERMOST_URL`` is
    set. The readiness entry is not required: a standby replica (no lease) is still ready.
    """
    if not runtime.settings.mattermost_url:
        return
    bot = MattermostBot(runtime)
    register_poster(app, MattermostPoster(bot))
    add_readiness_check(app, "mattermost-listener", health.readiness_check(runtime),
                        required=False)

    stop = asyncio.Event()

    async def stopping(app: web.Application) -> None:  # beside the consumers' drains
        stop.set()

    async def run_listener(app: web.Application) -> AsyncIterator[None]:
        stop.clear()
        async with bot.session():
            task = asyncio.create_task(bot.listener.run(stop))
            yield
            stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(bot.config.drain_seconds + 5):
                    await task

    app.on_shutdown.append(stopping)
    app.cleanup_ctx.append(run_listener)
    bot.inbox.run_with(app, bot.ready)  # stopped before the session above closes
