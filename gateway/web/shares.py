"""A per-credential share of a process's shared slots: one credential may hold at most
``per_credential`` of them at once, so a client that floods a slotted route cannot take
every slot and fail everyone else's requests (it gets 429 for what passes its share, the
others keep the rest of the slots). Counts live only while held: bounded by the slots."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gateway.api.errors import ApiError


class Shares:
    def __init__(self, per_credential: int, retry_seconds: int) -> None:
        self.per_credential = per_credential
        self.retry_seconds = retry_seconds
        self._held: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, owner: str, what: str) -> Iterator[None]:
        """One slot's share for ``owner``, or 429 when it holds its share already."""
        held = self._held.get(owner, 0)
        if held >= self.per_credential:
            raise ApiError(429, "rate_limited", f"this credential already runs {held} {what} "
                           "at once, its share; retry when one ends",
                           {"Retry-After": str(self.retry_seconds)})
        self._held[owner] = held + 1
        try:
            yield
        finally:
            left = self._held[owner] - 1
            if left:
                self._held[owner] = left
            else:
                del self._held[owner]
