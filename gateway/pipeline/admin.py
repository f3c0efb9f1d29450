"""Operations views of the pipeline, for the admin routes and the dashboard."""

from gateway.pipeline.deadletter import list_dead, purge, requeue
from gateway.pipeline.status import queue_depths

__all__ = ["list_dead", "purge", "queue_depths", "requeue"]
