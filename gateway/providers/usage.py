"""Usage rows and budgets: a row per provider call in PostgreSQL, and ``[budgets]`` daily
limits checked as SQL sums over today's rows (UTC) before a call. A sum, not a counter, so
the record and the budget can never disagree, and each budget's sum is an index-only range
scan (migration 0009). ::

    [budgets]
    daily_tokens_per_chat = 20000       # one chat's calls today (its chat key)
    daily_tokens_per_account = 200000   # one account's calls today
    daily_tokens = 2000000              # every call today
    daily_tokens_recheck_seconds = 1    # each sum is re-read at most this often (0: always)

Each process reads a sum at most once every ``daily_tokens_recheck_seconds`` (the day's
total, a chat's and an account's alike; concurrent callers share the read) and adds its own
calls to what it read as they are recorded (``gateway.providers.sums``). A budget is reached
once today's sum is at or above it; the call that crosses it runs, so a day ends at most one
call, the calls in flight, and the other processes' calls of the last
``daily_tokens_recheck_seconds`` above its budget. Rows of concurrent calls are written in one
statement (``gateway.providers.rows``); each call returns once its row is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from gateway.config import ConfigError, Settings
from gateway.providers.client import Usage
from gateway.providers.errors import Budget, OverBudget
from gateway.providers.rows import RowWriter
from gateway.providers.sums import Key, Sums
from gateway.stores.postgres import leave_clean
from gateway.stores.refreshed import Refreshed

log = logging.getLogger(__name__)

GROUPS: Mapping[str, str] = {
    "provider": "provider",
    "model": "model",
    "chat": "coalesce(chat_key, '')",
    "day": "to_char(date_trunc('day', created_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD')",
}

_TODAY = "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"

# The day's total is a sum over every row of the day; a chat's and an account's sums cover
# only their own rows (those of concurrent checks in one statement, one equality range scan
# per key as a single key's read was: an ``= ANY`` over all of them measured 2-7x
# ``SELECT 1`` where this is 1.2-2.5x). Each is read at most every ``recheck_seconds`` per
# process.
_TOTAL = f"""
SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM provider_usage WHERE created_at >= {_TODAY}
"""
_SUMS = f"""
SELECT 'chat', k, (SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM provider_usage
                   WHERE chat_key = k AND created_at >= {_TODAY}) FROM unnest($1::text[]) AS k
UNION ALL
SELECT 'account', k, (SELECT coalesce(sum(tokens_in + tokens_out), 0) FROM provider_usage
                      WHERE account = k AND created_at >= {_TODAY}) FROM unnest($2::text[]) AS k
"""


@dataclass(frozen=True)
class Charge:
    """Who a call is for: its usage row names them and their budgets are checked."""

    chat: str | None = None      # the chat key of a conversation
    job: str | None = None       # a pipeline item or job id
    account: str | None = None   # the account (a token's subject) behind it


@dataclass(frozen=True)
class Budgets:
    per_chat: int | None = None
    per_account: int | None = None
    total: int | None = None
    recheck_seconds: float = 1.0  # how stale a sum may be (0: read on every call)


def budgets(settings: Settings) -> Budgets:
    section = settings.section("budgets")
    values: dict[str, int | None] = {}
    for name in ("daily_tokens_per_chat", "daily_tokens_per_account", "daily_tokens"):
        value = section.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value <= 0):
            raise ConfigError(f"[budgets].{name}", "must be a positive whole number")
        values[name] = value
    recheck = section.get("daily_tokens_recheck_seconds", 1.0)
    if isinstance(recheck, bool) or not isinstance(recheck, int | float) or recheck < 0:
        raise ConfigError("[budgets].daily_tokens_recheck_seconds", "must be a number >= 0")
    return Budgets(values["daily_tokens_per_chat"], values["daily_tokens_per_account"],
                   values["daily_tokens"], float(recheck))


class UsageLedger:
    """Records calls and checks budgets on the PostgreSQL pool."""

    def __init__(self, pool: asyncpg.Pool, limits: Budgets) -> None:
        self.pool = pool
        self.limits = limits
        self.total: Refreshed[int] = Refreshed(self._read_total, 0, limits.recheck_seconds)
        self.sums = Sums(self._read_sums, limits.recheck_seconds)
        self.rows = RowWriter(pool)

    async def _read_total(self) -> int:
        async with self.pool.acquire() as conn:
            total = await conn.fetchval(_TOTAL)
            leave_clean(conn)  # a read alone leaves nothing in the session
        return int(total)

    async def _read_sums(self, chats: list[str], accounts: list[str]) -> dict[Key, int]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_SUMS, chats, accounts)
            leave_clean(conn)  # a read alone leaves nothing in the session
        return {(kind, name): int(used) for kind, name, used in rows}

    async def check(self, charge: Charge) -> None:
        """Raise ``OverBudget`` when a configured budget of ``charge`` is reached today."""
        limits = self.limits
        chat = charge.chat if limits.per_chat is not None else None
        account = charge.account if limits.per_account is not None else None
        total = None
        if limits.total is not None:  # fresh values are read without a coroutine's cost
            total = self.total.value if self.total.fresh else await self.total.get()
        chat_used = account_used = None
        if chat is not None or account is not None:
            cached = self.sums.cached(chat, account)
            chat_used, account_used = (cached if cached is not None
                                       else await self.sums.get(chat, account))
        for scope, used, limit in (("total", total, limits.total),
                                   ("chat", chat_used, limits.per_chat),
                                   ("account", account_used, limits.per_account)):
            if used is not None and limit is not None and used >= limit:
                raise OverBudget(Budget(scope, int(used), limit))

    async def record(self, *, provider: str, model: str, kind: str, usage: Usage,
                     charge: Charge) -> None:
        """One row for a finished call, stored with the rows of concurrent calls (one
        statement), its tokens counted at once in this process's sums. A failed write is
        logged, not raised: the call has happened and its answer is worth more than its row."""
        await self.stored(self.submit(provider=provider, model=model, kind=kind, usage=usage,
                                      charge=charge), kind, provider)

    def submit(self, *, provider: str, model: str, kind: str, usage: Usage,
               charge: Charge) -> asyncio.Future[None]:
        """``record`` without the wait: the row queued for the next statement and its
        tokens counted, at once; ``stored`` waits for the row. A caller with other round
        trips to make (a provider call's slot release) overlaps them with the row's."""
        self.sums.add(charge.chat, charge.account, usage.total)
        self.total.value += usage.total
        return self.rows.submit((provider, model, kind, usage.prompt_tokens,
                                 usage.completion_tokens, usage.estimated, charge.chat,
                                 charge.job, charge.account))

    async def stored(self, written: asyncio.Future[None], kind: str, provider: str) -> None:
        """Wait for a row ``submit`` queued; a failed write is logged, as in ``record``."""
        try:  # not shielded: a caller cancelled here leaves its row queued, written all the
            # same (the batch answers only futures not done yet)
            await written
        except (asyncpg.PostgresError, OSError) as exc:
            log.warning("usage row of a %s call to %s not written: %s", kind, provider, exc)


def start_of_day(days_back: int = 0) -> datetime:
    """Midnight UTC ``days_back`` days ago (the day budgets and reports count from)."""
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days_back)


async def usage_report(pool: asyncpg.Pool, group: str, since: datetime) -> list[dict[str, Any]]:
    """Sums of the rows since ``since`` by ``group`` (a key of ``GROUPS``), by key."""
    expression = GROUPS[group]
    rows = await pool.fetch(
        f"SELECT {expression} AS key, count(*) AS calls, sum(tokens_in) AS tokens_in, "
        f"sum(tokens_out) AS tokens_out FROM provider_usage WHERE created_at >= $1 "
        f"GROUP BY 1 ORDER BY 1", since)
    return [{"key": row["key"], "calls": row["calls"], "tokens_in": int(row["tokens_in"]),
             "tokens_out": int(row["tokens_out"]),
             "tokens": int(row["tokens_in"]) + int(row["tokens_out"])} for row in rows]
