"""Operations views of the pipeline for the dashboard and admin routes."""

from gateway.pipeline.status import queue_depths

__all__ = ["queue_depths"]
