"""Twins of the disk tier's collaborators, for tests that step into a call.

A compiled build's tier checks the type of what it is given and calls its collaborators'
methods without looking them up on the instance: a test can neither hand the store an
object of another type (a proxy) nor patch a method of its blocking client, write stamps
or node states. What works in both builds is a twin: another instance of the
collaborator's class over the same cluster, stamp table or state files, made from an
interpreted subclass (whose methods are looked up per call, as Python does), with some
methods replaced. The store is given the twin, and the original back afterwards.

A twin of the write stamps whose ``bump`` or ``current`` is replaced is not called by the
tier's flat ``set_now``, ``delete_now``, ``incr_now`` and ``touch_now`` while the node is up:
those call ``bump_slot``, ``replace_slot`` and ``current_slot`` (``bump`` and ``current``
call the first and the last in turn).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django_fastcache.client.blocking import BlockingClient
from django_fastcache.disk.nodestate import NodeStates
from django_fastcache.disk.stamps import WriteStamps

T = TypeVar("T")


def twin(original: T, **methods: Callable[..., Any]) -> T:
    """Another instance of ``original``'s class over the same resources, whose ``methods``
    (plain callables, without ``self``) replace the class's."""
    cls: Any = type(f"Twin{type(original).__name__}", (type(original),), {})
    made: Any
    if isinstance(original, BlockingClient):
        made = cls(original.cluster, original.health)
        made.timed = original.timed
    elif isinstance(original, WriteStamps):
        made = cls(original.path, shm_root=original.shm_root)
    elif isinstance(original, NodeStates):
        made = cls(original.directory, original.node_ids)
    else:
        raise TypeError(f"no twin for {type(original).__name__}")
    for name, method in methods.items():
        if not callable(getattr(made, name, None)):
            raise AttributeError(f"{type(original).__name__} has no method {name}")
        setattr(made, name, method)
    return made  # type: ignore[no-any-return]


def calling_first(client: BlockingClient, method: str, hook: Callable[[], None]) -> BlockingClient:
    """A twin of ``client`` that runs ``hook`` once, just before its first call of
    ``method``."""
    original = getattr(client, method)
    pending: list[Callable[[], None]] = [hook]

    def call(*args: Any, **kwargs: Any) -> Any:
        if pending:
            pending.pop()()
        return original(*args, **kwargs)

    return twin(client, **{method: call})
