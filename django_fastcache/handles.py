"""Weak references to compiled objects, through a handle.

A class compiled with mypyc has no slot for weak references. A registry that must not keep
its members alive (the maintenance thread's stores, the writers a fork or the exit must
reach) holds a :class:`Handle` weakly instead, and the object holds its handle: the two go
together once nothing else holds the object (a cycle the garbage collector breaks). This
module stays Python, so that its class can be referenced weakly in both builds.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Handle(Generic[T]):
    """What a registry holds weakly of ``target``, which holds it in turn."""

    __slots__ = ("__weakref__", "target")

    def __init__(self, target: T) -> None:
        self.target = target


__all__ = ["Handle"]
