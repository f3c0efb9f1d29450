"""The brute-force barrier (``brute:``, gateway/security/brute.py) in front of the chat
platforms' routes: an address that keeps presenting a wrong Telegram secret or a bad Slack
signature is refused with 429 for a while, like a webhook sender with bad signatures."""

from __future__ import annotations

from aiohttp import web

from gateway.api.errors import ApiError
from gateway.inbound.http_intake import install, refuse_during_maintenance
from gateway.stores.runtime import Runtime


class Guard:
    def __init__(self, app: web.Application, runtime: Runtime) -> None:
        inbound = install(app, runtime)
        self.barrier = inbound.barrier
        self.maintenance = inbound.maintenance

    async def admit(self, request: web.Request) -> str:
        """The client address, after refusing the request during maintenance (503, the
        platform retries) and the address (429) while it is blocked."""
        await refuse_during_maintenance(self.maintenance)
        ip = self.barrier.client_ip(request)
        await self.barrier.check(ip)
        return ip

    async def refuse(self, ip: str, error: ApiError) -> ApiError:
        """Count the failed check; the error to raise (429 when this failure blocked)."""
        blocked_for = await self.barrier.record_failure(ip)
        return self.barrier.refusal(blocked_for) if blocked_for else error
