"""Running one scenario against both clients: the asyncio Client and the BlockingClient.

A scenario is an ``async def`` taking a :class:`CommandSet`; the ``run`` fixture of a test
module built on :func:`runner_fixture` runs it on a fresh client of each kind (through
``asyncio.run``, or through the sync bridge) and closes the client afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from django_fastcache.bridge import run_blocking
from django_fastcache.client import Client
from django_fastcache.client.blocking import BlockingClient
from django_fastcache.client.cluster import ClientSettings, Cluster
from django_fastcache.client.commands import CommandSet

T = TypeVar("T")
Scenario = Callable[[CommandSet], Coroutine[Any, Any, T]]


class Runner:
    """Runs a scenario on a fresh client of one kind and closes the client afterwards."""

    def __init__(self, kind: str, **defaults: Any) -> None:
        self.kind = kind
        self.defaults = defaults

    def __call__(self, servers: list[str], scenario: Scenario[T], **settings: Any) -> T:
        settings = {**self.defaults, **settings}
        if self.kind == "async":
            return asyncio.run(self._run_async(servers, scenario, settings))
        client = BlockingClient(Cluster(servers, ClientSettings(**settings)))
        try:
            return run_blocking(scenario(client))
        finally:
            client.close_thread_connections()

    @staticmethod
    async def _run_async(servers: list[str], scenario: Scenario[T], settings: Any) -> T:
        client = Client(servers, **settings)
        try:
            return await scenario(client)
        finally:
            await client.aclose()


def runner_fixture(**defaults: Any) -> Any:
    """A ``run`` fixture, once per client kind, with these client settings by default."""

    @pytest.fixture(params=["async", "blocking"])
    def run(request: pytest.FixtureRequest) -> Runner:
        return Runner(request.param, **defaults)

    return run
