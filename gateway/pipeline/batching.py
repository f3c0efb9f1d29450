"""How many items a stage's next FETCH leases.

A batch shares its transaction, its commit and its statements among its items, so a fast
stage wants large batches (the default handlers cost 40 % less CPU per item at 32 than at 8).
A slow handler (a model call of seconds) runs its batch's items one after another in one
loop, so a large batch would leave the other loops idle while it holds the queue's items.
The size follows the stage's recent time per item: as many items as fit in
``[pipeline] batch_seconds``, at most ``[pipeline] batch``, at least one.
"""

from __future__ import annotations

# Weight of the newest batch in the running time per item.
SMOOTHING = 0.3


class BatchSizer:
    """The batch size of one stage in one process, shared by its loops."""

    def __init__(self, most: int, seconds: float) -> None:
        self.most = max(1, most)
        self.seconds = seconds
        self.per_item: float | None = None  # seconds, smoothed; None until a batch ran

    def size(self) -> int:
        """Items to lease next: one until a batch has been timed (a slow handler's first
        FETCH takes no more than it can start at once)."""
        if self.per_item is None:
            return 1
        if self.per_item <= 0:
            return self.most
        return max(1, min(self.most, int(self.seconds / self.per_item)))

    def timed(self, items: int, seconds: float) -> None:
        """A batch of ``items`` took ``seconds`` from lease to commit."""
        if items <= 0:
            return
        each = seconds / items
        self.per_item = each if self.per_item is None else (
            SMOOTHING * each + (1 - SMOOTHING) * self.per_item)
