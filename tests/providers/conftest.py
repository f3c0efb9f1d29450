"""Providers wired to fakes: ``make_providers(("a", fake), ("b", url), **limits)`` builds a
``ModelProviders`` on the test's runtime, closed after the test."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.providers import ModelProviders
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI, provider_tables
from tests.fakes.pytest_plugin import OPENAI_KEY

MakeProviders = Callable[..., ModelProviders]


@pytest.fixture
async def make_providers(runtime: Runtime, monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[MakeProviders]:
    monkeypatch.setenv("FAKE_OPENAI_KEY", OPENAI_KEY)
    made: list[ModelProviders] = []

    def factory(*fakes: tuple[str, FakeOpenAI | str], budgets: dict[str, int] | None = None,
                **limits: Any) -> ModelProviders:
        sections = {**runtime.settings.sections,
                    "providers": provider_tables(*fakes, **limits),
                    "budgets": budgets or {}}
        settings = dataclasses.replace(runtime.settings, sections=sections)
        providers = ModelProviders.from_settings(settings, runtime.durable, runtime.pg)
        made.append(providers)
        return providers

    yield factory
    for providers in made:
        await providers.close()
