"""serve and worker run on uvloop unless ``GATEWAY_LOOP=asyncio`` (gateway/app/loop.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.app import loop


def test_uvloop_by_default_asyncio_on_request_and_a_typo_refused() -> None:
    assert loop.chosen({}) == "uvloop"  # installed with the gateway (not on Windows)
    assert loop.chosen({"GATEWAY_LOOP": "uvloop"}) == "uvloop"
    assert loop.chosen({"GATEWAY_LOOP": "asyncio"}) == "asyncio"
    with pytest.raises(SystemExit, match="GATEWAY_LOOP must be one of"):
        loop.chosen({"GATEWAY_LOOP": "uv"})


def test_run_uses_the_chosen_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    monkeypatch.delenv("GATEWAY_LOOP", raising=False)
    assert loop.run(loop_module()).startswith("uvloop")
    monkeypatch.setenv("GATEWAY_LOOP", "asyncio")
    assert loop.run(loop_module()).startswith("asyncio")
