"""``FastCache``: Django's cache API over the asyncio memcached client.

The backend does keys, timeouts, values and Django's semantics; the wire is the client's
(the split Django draws between ``RedisCache`` and ``RedisCacheClient``). Every operation is
written once, as a coroutine: the async API (``aget``, ``aset``...) awaits it on the
caller's loop with the asyncio client, and the sync API runs it with the blocking client
through the sync bridge, on the calling thread and without an event loop. Clients, and so
connections, are process-global and shared by every backend
instance with the same configuration; Django creates a backend per thread and per request
and calls ``close()`` after each request, which therefore has nothing to do.

Values go through a store: memcached alone, or memcached with the disk tier behind it
(:mod:`django_fastcache.tiered`, on by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, TypeVar

from django.conf import settings
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, InvalidCacheKey
from django.core.exceptions import ImproperlyConfigured

from .. import signals
from ..bridge import run_blocking
from ..client import Client
from ..client.address import parse_locations
from ..client.blocking import BlockingClient
from ..client.cluster import Cluster
from ..client.commands import ADD_SEEING_MAX, CommandSet
from ..client.events import NodeEvent
from ..client.metrics import MetricsSnapshot
from ..disk import DiskStore, Journal, NodeStates
from ..disk.location import default_directory
from ..disk.location import prepare as prepare_directory
from ..errors import (
    ClientError,
    ConfigurationError,
    InvalidArgumentError,
    NetworkError,
    NonIntegerValueError,
    ValueRefusedError,
    ValueTooLargeError,
)
from ..expiry import MAX_EXPTIME, MAX_RELATIVE_EXPIRY, memcached_exptime, seconds_to_live
from ..maintenance import maintenance
from ..protocol.commands import UINT64_MAX
from ..sealing import FLAG_SEALED, Refusals, Sealer, derive_key
from ..serializers import SERIALIZERS, PickleSerializer, Serializer
from ..stalecopies import StaleKeepingStore
from ..stampede import (
    add_over_stub,
    async_pause,
    blocking_pause,
    is_stub,
    is_stub_now,
    makes_stubs,
)
from ..stampede import get_or_set as _leased_get_or_set
from ..stampede import invalidate as _invalidate
from ..stores import MemcachedStore, Store
from ..tiered import TieredStore
from .options import FastCacheOptions, parse_options

T = TypeVar("T")

MEMCACHE_MAX_KEY_LENGTH = 250
#: Wire keys each backend instance remembers (then it starts afresh).
_WIRE_KEYS_KEPT = 4096
_UNSAFE_KEY_BYTES = re.compile(rb"[\x00-\x20\x7f]")


@dataclass(frozen=True)
class Shared:
    """What every backend instance with one configuration shares in a process."""

    client: Client
    blocking: BlockingClient
    store: Store
    tiered: TieredStore | None
    #: memcached alone with its plain store: the sync API may take its flat paths.
    flat: bool = False


_shared: dict[tuple[Any, ...], Shared] = {}
_shared_lock = threading.Lock()


def _reset_shared_lock_in_child() -> None:
    # A thread of the parent building a stack at the fork held the lock: nothing in the
    # child would ever release it.
    global _shared_lock
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_shared_lock_in_child)


def shared_stack(servers: list[str], options: FastCacheOptions) -> Shared:
    """The process-wide clients and store for these servers and options."""
    identity = (tuple(servers), options)
    shared = _shared.get(identity)
    if shared is None:
        with _shared_lock:
            shared = _shared.get(identity)
            if shared is None:
                shared = _shared[identity] = _build_stack(servers, options)
    return shared


def _build_stack(servers: list[str], options: FastCacheOptions) -> Shared:
    client = Client(
        servers,
        timeout=options.operation_timeout,
        connect_timeout=options.connect_timeout,
        min_connections=options.min_connections,
        max_connections=options.max_connections,
        idle_timeout=options.idle_timeout,
        latency_metrics=options.latency_metrics,
        autobatching=options.autobatching,
        pipelining=options.pipelining,
        # Replies may carry values other clients stored, up to the server's limit.
        max_value_size=max(options.max_value_size, 1024 * 1024) + 1024,
        placement=options.placement,
        autodiscovery=options.autodiscovery,
        autodiscovery_interval=options.autodiscovery_interval,
        ssl=options.ssl,
        username=options.username,
        password=options.password,
        # "classic": no meta command is sent, the disk tier's included (its classic ways).
        meta=options.protocol != "classic",
    )
    # One health for both clients: either one's requests tell it, both report it.
    blocking = BlockingClient(client.cluster, client.health)
    blocking.timed = options.latency_metrics
    client.on_node_event(_announce_node_event)
    if not options.disk_tier:
        if options.stale_on_delete > 0:
            store = StaleKeepingStore(options.stale_on_delete, options.protocol)
            return Shared(client, blocking, store, None)
        return Shared(client, blocking, MemcachedStore(), None, flat=True)
    directory = options.disk_directory or default_directory(servers)
    try:
        prepare_directory(directory)
        tiered = TieredStore(
            client.cluster,
            blocking,
            DiskStore(
                os.path.join(directory, "values"),
                shards=options.disk_shards,
                size_limit=options.disk_size_limit,
                eviction_policy=options.disk_eviction_policy,
                timeout=options.disk_timeout,
            ),
            Journal(os.path.join(directory, "journal.sqlite3")),
            NodeStates(os.path.join(directory, "nodes"), client.cluster.node_ids),
            max_staleness=options.disk_max_staleness,
            read_copies=options.disk_read_copies,
            write_delay=options.disk_write_delay,
            on_node_out=lambda node_id: _announce_node_out(node_id, directory),
            on_node_back=lambda node_id, replayed: _announce_node_back(
                node_id, directory, replayed
            ),
            directory=directory,
        )
    except OSError as exc:  # the directory refused, or its write stamps not to be had
        raise ImproperlyConfigured(f"FastCache disk tier: {exc}") from exc
    maintenance.register(tiered)
    # Node pages no process has checked against the journal yet (made again, their files
    # lost): out again where the journal names keys, before a request reads them as up.
    tiered.recover_lost_states()
    if tiered.states.any_out():
        maintenance.node_went_out()  # probed from now on
    return Shared(client, blocking, tiered, tiered)


#: Deltas within this are counted by memcached, and compare as machine integers compiled.
_SMALL: Final = 2**62 - 1


def _delta(delta: Any) -> int:
    """An ``incr``/``decr`` delta: an int (not a bool) memcached can count by, else refused
    as the protocol's encoders refuse it, before any request (a store may ask memcached
    something before it encodes the increment)."""
    if type(delta) is not int:
        raise InvalidArgumentError(f"delta must be an int, got {type(delta).__name__}")
    # (The first test in machine integers, compiled; the second only for deltas past them.)
    if not -_SMALL <= delta <= _SMALL and not -UINT64_MAX <= delta <= UINT64_MAX:
        raise InvalidArgumentError(
            f"delta must be between {-UINT64_MAX} and {UINT64_MAX}, got {delta}"
        )
    return delta


def _announce_node_event(event: NodeEvent) -> None:
    signal = signals.node_healthy if event.healthy else signals.node_unhealthy
    signal.send(sender=FastCache, node=event.node, event=event)


def _announce_node_out(node_id: str, directory: str) -> None:
    maintenance.node_went_out()
    with contextlib.suppress(Exception):  # a receiver's error must not fail the request
        signals.node_out.send(sender=FastCache, node=node_id, directory=directory)


def _announce_node_back(node_id: str, directory: str, replayed_keys: int) -> None:
    signals.node_back.send(
        sender=FastCache, node=node_id, directory=directory, replayed_keys=replayed_keys
    )


def make_serializer(options: FastCacheOptions) -> Serializer:
    cls = SERIALIZERS[options.serializer]
    if cls is PickleSerializer:
        return PickleSerializer(
            options.compress_min_length,
            options.compress_level,
            options.pickle_protocol,
            options.max_value_size,
        )
    return cls(options.compress_min_length, options.compress_level, options.max_value_size)


#: What _decode gives for a value that must not be loaded: a miss.
_REFUSED: Any = object()
#: get_or_set called without its default.
_NO_DEFAULT: Any = object()


def _key_bytes(made: str) -> bytes | None:
    """The key's UTF-8 bytes; None when it has none (lone surrogates)."""
    try:
        return made.encode()
    except UnicodeEncodeError:
        return None


def _raise_invalid_key(made: str, data: bytes | None) -> None:
    """Raise Django's ``InvalidCacheKey``, with its messages, when ``data`` is unusable."""
    if data is None:
        raise InvalidCacheKey(
            f"Cache key contains characters that will cause errors if used with memcached: {made!r}"
        )
    if len(data) > MEMCACHE_MAX_KEY_LENGTH:
        raise InvalidCacheKey(
            f"Cache key will cause errors if used with memcached: {made!r} "
            f"(longer than {MEMCACHE_MAX_KEY_LENGTH})"
        )
    if _UNSAFE_KEY_BYTES.search(data):
        raise InvalidCacheKey(
            f"Cache key contains characters that will cause errors if used with memcached: {made!r}"
        )


def _not_an_integer(wire: bytes) -> NonIntegerValueError:
    # memcached refuses to count a value that is not a decimal number (a pickled object, a
    # negative int): the same mistake locmem reports as a TypeError.
    return NonIntegerValueError(f"the value of {wire.decode()!r} is not an integer")


def _not_found(wire: bytes) -> ValueError:
    return ValueError(f"Key '{wire.decode()}' not found")


class FastCache(BaseCache):
    """A Django cache backend for memcached. See the configuration reference in the docs."""

    # ``server`` is whatever LOCATION holds: a wrong type is reported on use, not here.
    def __init__(self, server: object, params: dict[str, Any]) -> None:
        given = params.get("OPTIONS")
        if not isinstance(given, Mapping):
            # Django's own __init__ reads OPTIONS with .get(): OPTIONS that are not a dict
            # (E009) would stop it with an AttributeError before the check could name them.
            params = {**params, "OPTIONS": {}}
        super().__init__(params)
        # A bad configuration is refused on first use, not here: Django's own system checks
        # build every cache alias, and raising here would stop them before FastCache's check
        # could report each problem with its id.
        self._configuration_error: str | None = None
        try:
            # Kept as given, the way Django's memcached backends keep it.
            self._servers = parse_locations(server)  # type: ignore[arg-type]
        except ConfigurationError as exc:
            self._servers = []
            self._configuration_error = f"Bad FastCache LOCATION: {exc}"
        except TypeError:
            self._servers = []
            self._configuration_error = (
                f"Bad FastCache LOCATION: a string or a list of strings, got {server!r}."
            )
        options, problems = parse_options(given)
        if problems:
            # Every problem, the LOCATION's included: one fix at a time would take a start each.
            bad_options = "Bad FastCache OPTIONS: " + " ".join(p.message for p in problems)
            self._configuration_error = " ".join(
                filter(None, (self._configuration_error, bad_options))
            )
        self._options = options
        self._serializer = make_serializer(options)
        self._refusals = Refusals()
        self._sealer: Sealer | None = None
        if options.sign_values:
            secret = options.signing_key
            fallbacks: tuple[bytes, ...] = ()
            if secret is None:
                try:
                    secret = settings.SECRET_KEY
                    # Values sealed before a rotation still open (Django's own rule).
                    olds = getattr(settings, "SECRET_KEY_FALLBACKS", None) or ()
                    fallbacks = tuple(derive_key(old) for old in olds if old)
                except ImproperlyConfigured:
                    secret = ""
            if secret:
                self._sealer = Sealer(derive_key(secret), self._refusals, fallbacks)
            elif self._configuration_error is None:
                self._configuration_error = (
                    "FastCache seals values with a key from SECRET_KEY, which is empty: set"
                    " SECRET_KEY or the signing_key option (or sign_values: False, at the"
                    " risk the security page of the docs describes)."
                )
        self._stack: Shared | None = None  # no I/O in __init__: built on first use
        # Wire keys of recent str (and bytes) keys at the default version: making,
        # encoding and checking a key costs more than looking it up.
        self._wire_keys: dict[str | bytes, bytes] = {}
        # memcached's exptime for the default timeout, when it is a plain relative one.
        self._default_exptime: int | None = None
        # And as seconds to live (_ttl), asked on every tiered write. (seconds_to_live would
        # cap it at the latest time memcached can hold, which lies more than 30 days ahead
        # until December 2037.)
        self._default_ttl: float | None = None
        default = self.default_timeout
        if type(default) is int and 0 < default <= MAX_RELATIVE_EXPIRY:
            self._default_exptime = default
            self._default_ttl = float(default)

    # -- plumbing ------------------------------------------------------------------------
    def _shared(self) -> Shared:
        stack = self._stack
        if stack is None:
            if self._configuration_error is not None:
                raise ImproperlyConfigured(self._configuration_error)
            stack = self._stack = shared_stack(self._servers, self._options)
        return stack

    @property
    def client(self) -> Client:
        """The shared asyncio client (created on first use)."""
        return self._shared().client

    @property
    def blocking_client(self) -> BlockingClient:
        """The shared blocking client the sync API uses."""
        return self._shared().blocking

    @property
    def _store(self) -> Store:
        return self._shared().store

    def metrics(self) -> dict[str, MetricsSnapshot]:
        """This process's counters per node and operation, by client: ``"blocking"`` (the
        sync API) and ``"async"`` (the async API). See docs/metrics.md."""
        stack = self._shared()
        return {"blocking": stack.blocking.metrics(), "async": stack.client.metrics()}

    @property
    def disk_directory(self) -> str | None:
        """The disk tier's directory (the ``disk_directory`` option, or the one derived
        from LOCATION); None when the tier is off. Reading it makes nothing."""
        if not self._options.disk_tier:
            return None
        return self._options.disk_directory or default_directory(self._servers)

    def disk_tier_made(self) -> bool:
        """Whether this alias's disk tier exists: built in this process, or its directory
        made by some process (the first request of any process makes it)."""
        if self._stack is not None:
            return self._stack.tiered is not None
        directory = self.disk_directory
        return directory is not None and os.path.isdir(directory)

    def untiered_cluster(self) -> Cluster:
        """The alias's memcached nodes and client settings, reached without making its disk
        tier: for a tool that reports on an alias and must leave no files behind (the
        tier's directory and its table in ``/dev/shm``), such as ``fastcache status``."""
        if self._stack is not None:
            return self._stack.blocking.cluster
        if self._configuration_error is not None:
            raise ImproperlyConfigured(self._configuration_error)
        options = replace(self._options, disk_tier=False)
        return shared_stack(self._servers, options).blocking.cluster

    def tier_stats(self) -> dict[str, Any] | None:
        """The disk tier's state: per node ``state`` (up/out) and ``journal_length``, and
        this process's counters (fallbacks, disk hits, refills, journaled writes, replays,
        disk failures). None when the disk tier is off."""
        tiered = self._shared().tiered
        return None if tiered is None else tiered.snapshot()

    def wire_key(self, key: Any, version: int | None = None) -> bytes:
        """The key as sent to memcached: prefixed, versioned, UTF-8, validated."""
        if version is None and (type(key) is str or type(key) is bytes):
            known = self._wire_keys.get(key)
            if known is not None:
                return known
            wire = self._make_wire_key(key, None)
            if len(self._wire_keys) >= _WIRE_KEYS_KEPT:
                self._wire_keys.clear()
            self._wire_keys[key] = wire
            return wire
        return self._make_wire_key(key, version)

    def _make_wire_key(self, key: Any, version: int | None) -> bytes:
        made = self.make_key(key, version=version)
        data: bytes | None
        try:
            data = made.encode()
        except UnicodeEncodeError:  # lone surrogates: the key has no UTF-8 form
            data = None
        if (
            data is not None
            and len(data) <= MEMCACHE_MAX_KEY_LENGTH
            and not _UNSAFE_KEY_BYTES.search(data)
        ):
            return data
        if self._options.hash_invalid_keys:
            raw = made.encode("utf-8", "surrogatepass")
            return b"fastcache:h:" + hashlib.blake2b(raw, digest_size=24).hexdigest().encode()
        _raise_invalid_key(made, data)
        raise AssertionError("unreachable: the key was found invalid")

    def validate_key(self, key: Any) -> None:
        """Raise ``InvalidCacheKey`` for a made key memcached cannot carry."""
        if not self._options.hash_invalid_keys:
            _raise_invalid_key(str(key), _key_bytes(str(key)))

    def _ttl(self, timeout: float | object | None) -> float | None:
        """Django's timeout as seconds to live: None forever, 0 already expired."""
        if timeout is DEFAULT_TIMEOUT:
            if self._default_ttl is not None:
                return self._default_ttl
            timeout = self.default_timeout
        if timeout is not None and (
            not isinstance(timeout, (int, float))
            or (isinstance(timeout, float) and math.isnan(timeout))
        ):
            raise InvalidArgumentError(
                f"timeout must be a number of seconds, or None for no expiry; got {timeout!r}"
            )
        if isinstance(timeout, int) and not -MAX_EXPTIME <= timeout <= MAX_EXPTIME:
            # Past any expiry memcached holds, and perhaps past a float's range.
            timeout = MAX_EXPTIME if timeout > 0 else -1
        return seconds_to_live(timeout, time.time())

    def get_backend_timeout(self, timeout: float | object | None = DEFAULT_TIMEOUT) -> int:
        """Django's timeout as memcached's exptime: 0 never expires, -1 already expired."""
        if timeout is DEFAULT_TIMEOUT and self._default_exptime is not None:
            return self._default_exptime
        return memcached_exptime(self._ttl(timeout), time.time())

    def _encode(self, value: Any, wire: bytes) -> tuple[bytes, int]:
        data, flags = self._serializer.dumps(value)
        if len(data) > self._options.max_value_size:
            raise ValueTooLargeError(
                f"value of {len(data)} bytes exceeds max_value_size "
                f"({self._options.max_value_size} bytes)"
            )
        sealer = self._sealer
        if sealer is not None:
            return sealer.seal(wire, data, flags)
        return data, flags

    def _opened(self, wire: bytes, data: bytes, flags: int) -> tuple[bytes, int] | None:
        """The serializer's bytes and flags of a value read back, or None when it must
        not be loaded (see :mod:`django_fastcache.sealing`)."""
        sealer = self._sealer
        if sealer is not None:
            return sealer.open(wire, data, flags)
        if flags & FLAG_SEALED:
            self._refusals.refuse(wire, "it is sealed, and sign_values is off here")
            return None
        if is_stub(data, flags):
            return None  # a lease's stub (see stampede.py): a miss, nothing to report
        return data, flags

    def _decode(self, wire: bytes, data: bytes, flags: int) -> Any:
        """The value read back, or ``_REFUSED`` (a logged miss)."""
        if self._sealer is not None or flags & FLAG_SEALED:
            opened = self._opened(wire, data, flags)
            if opened is None:
                return _REFUSED
            data, flags = opened
        elif not data and not flags:
            return _REFUSED  # a lease's stub (see stampede.py): a miss, nothing to report
        try:
            return self._serializer.loads(data, flags)
        except ValueRefusedError as exc:
            self._refusals.refuse(wire, str(exc))
            return _REFUSED

    @property
    def refused_values(self) -> int:
        """Values this process read back and refused to load (unsealed, sealed with
        another secret or for another key, or inflating past max_value_size)."""
        return self._refusals.count

    # -- each operation, once, over either client --------------------------------------------
    async def _get(
        self, client: CommandSet, key: Any, default: Any = None, version: int | None = None
    ) -> Any:
        wire = self.wire_key(key, version)
        found = await self._store.get(client, wire)
        if found is None:
            return default
        value = self._decode(wire, *found)
        return default if value is _REFUSED else value

    async def _set(
        self,
        client: CommandSet,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        wire = self.wire_key(key, version)
        store = self._store
        try:
            data, flags = self._encode(value, wire)
            stored = await store.set(client, wire, data, flags, self._ttl(timeout))
        except ValueTooLargeError:
            # The old value must not outlive a failed set (sessions rely on this).
            await store.delete(client, wire)
            raise
        if not stored:
            await store.delete(client, wire)

    async def _add(
        self,
        client: CommandSet,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        wire = self.wire_key(key, version)
        data, flags = self._encode(value, wire)
        ttl = self._ttl(timeout)
        stack = self._shared()
        if stack.flat and len(data) <= ADD_SEEING_MAX and makes_stubs(self._options):
            # memcached alone, with its plain store (a store of its own, stale_on_delete's,
            # replaces stale copies itself). A refusal stands unless what holds the key is a
            # lease's stub, which the add replaces: the get that tells them apart goes with
            # the add (one round trip).
            exptime = memcached_exptime(ttl, time.time())
            stored, held = await client.add_seeing(wire, data, flags=flags, exptime=exptime)
            if stored:
                return True
            if held is None or not is_stub(held.value, held.flags):
                return False
            return await add_over_stub(self, client, wire, data, flags, ttl, stub_seen=True)
        if await stack.store.add(client, wire, data, flags, ttl):
            return True
        if stack.tiered is not None:
            return False  # the tier replaces a stub itself, when the disk has no value either
        # Refused: unless what holds the key is a lease's stub, which the add replaces.
        return await add_over_stub(self, client, wire, data, flags, ttl)

    async def _touch(
        self,
        client: CommandSet,
        key: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        wire = self.wire_key(key, version)
        return await self._store.touch(client, wire, self._ttl(timeout))

    async def _delete(self, client: CommandSet, key: Any, version: int | None = None) -> bool:
        return await self._store.delete(client, self.wire_key(key, version))

    async def _get_many(
        self, client: CommandSet, keys: Iterable[Any], version: int | None = None
    ) -> dict[Any, Any]:
        originals = {self.wire_key(key, version): key for key in keys}
        if not originals:
            return {}
        found = await self._store.get_many(client, list(originals))
        values = {originals[wire]: self._decode(wire, *value) for wire, value in found.items()}
        return {key: value for key, value in values.items() if value is not _REFUSED}

    async def _set_many(
        self,
        client: CommandSet,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        originals: dict[bytes, Any] = {}
        # By made key: two keys that make the same one (7 and "7") are one write, the last
        # (as two sets of it would leave), not two writes of one key in one call, of which
        # the disk tier could keep neither copy.
        encoded_by_wire: dict[bytes, tuple[bytes, int] | None] = {}
        for key, value in data.items():
            wire = self.wire_key(key, version)
            originals[wire] = key
            try:
                encoded_by_wire[wire] = self._encode(value, wire)
            except ValueTooLargeError:
                encoded_by_wire[wire] = None
        triples = [(w, *found) for w, found in encoded_by_wire.items() if found is not None]
        too_large = [w for w, found in encoded_by_wire.items() if found is None]
        store = self._store
        ttl = self._ttl(timeout)
        failed = await store.set_many(client, triples, ttl) if triples else []
        failed += too_large
        if failed:
            # No old value may outlive a failed write. Keys whose node is unreachable
            # cannot be deleted now; they are reported failed all the same.
            with contextlib.suppress(NetworkError):
                await store.delete_many(client, failed)
        return [originals[wire] for wire in failed]

    async def _delete_many(
        self, client: CommandSet, keys: Iterable[Any], version: int | None = None
    ) -> None:
        wires = [self.wire_key(key, version) for key in keys]
        if wires:
            await self._store.delete_many(client, wires)

    async def _incr(
        self, client: CommandSet, key: Any, delta: int = 1, version: int | None = None
    ) -> int:
        wire = self.wire_key(key, version)
        try:
            value = await self._store.incr(client, wire, delta)
        except NonIntegerValueError:
            raise
        except ClientError as exc:
            if await is_stub_now(client, wire):  # a lease's stub: the value is missing
                raise _not_found(wire) from exc
            raise _not_an_integer(wire) from exc
        if value is None:
            raise _not_found(wire)
        return value

    async def _decr(
        self, client: CommandSet, key: Any, delta: int = 1, version: int | None = None
    ) -> int:
        return await self._incr(client, key, -delta, version)

    async def _has_key(self, client: CommandSet, key: Any, version: int | None = None) -> bool:
        wire = self.wire_key(key, version)
        found = await self._store.get(client, wire)
        return found is not None and self._opened(wire, *found) is not None

    async def _clear(self, client: CommandSet) -> None:
        await self._store.clear(client)

    # -- the sync API: the operations run by the bridge over the blocking client -------------
    # With memcached alone, the single-key operations take a flat path instead: the same
    # steps as the coroutines above, as plain calls on the blocking client (the coroutine
    # layers cost about a tenth of a call). Each mirrors its coroutine line for line.
    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        stack = self._stack or self._shared()
        tiered = stack.tiered
        if tiered is not None:  # the same steps over the tier's flat path
            wire = self.wire_key(key, version)
            found = tiered.get_now(wire)
            if found is None:
                return default
            value = self._decode(wire, found[0], found[1])
            return default if value is _REFUSED else value
        if not stack.flat:  # a store of its own (stale_on_delete): its coroutine
            return run_blocking(self._get(stack.blocking, key, default, version))
        wire = self.wire_key(key, version)
        found = stack.blocking.value_now(wire, True)  # wire keys are valid by construction
        if found is None:
            return default
        value = self._decode(wire, found[0], found[1])
        return default if value is _REFUSED else value

    def set(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        stack = self._stack or self._shared()
        tiered = stack.tiered
        if tiered is not None:  # the same steps over the tier's flat path
            wire = self.wire_key(key, version)
            try:
                data, flags = self._encode(value, wire)
                stored = tiered.set_now(wire, data, flags, self._ttl(timeout))
            except ValueTooLargeError:
                tiered.delete_now(wire)  # the old value must not outlive a failed set
                raise
            if not stored:
                tiered.delete_now(wire)
            return
        blocking = stack.blocking
        wire = self.wire_key(key, version)
        try:
            data, flags = self._encode(value, wire)
            stored = blocking.store_now(
                b"set", wire, data, flags, self.get_backend_timeout(timeout), True
            )
        except ValueTooLargeError:
            blocking.delete_now(wire, True)  # the old value must not outlive a failed set
            raise
        if not stored:
            blocking.delete_now(wire, True)

    def add(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        stack = self._stack or self._shared()
        tiered = stack.tiered
        if tiered is not None:  # the same steps over the tier's flat path
            wire = self.wire_key(key, version)
            data, flags = self._encode(value, wire)
            return tiered.add_now(wire, data, flags, self._ttl(timeout))
        if not stack.flat:
            return run_blocking(self._add(stack.blocking, key, value, timeout, version))
        wire = self.wire_key(key, version)
        data, flags = self._encode(value, wire)
        exptime = self.get_backend_timeout(timeout)
        blocking = stack.blocking
        if not makes_stubs(self._options):
            return blocking.store_now(b"add", wire, data, flags, exptime, True)
        # A refusal stands unless what holds the key is a lease's stub, which the add
        # replaces. The common refusal, a value, is told by a plain get: sent with the add
        # for a short value (one round trip), after it for a long one (a stored add would
        # read it back).
        if len(data) <= ADD_SEEING_MAX:
            stored, held = blocking.add_seeing_now(wire, data, flags, exptime)
            if stored:
                return True
        elif blocking.store_now(b"add", wire, data, flags, exptime, True):
            return True
        else:
            held = blocking.value_now(wire, True)
        if held is None or not is_stub(held[0], held[1]):
            return False
        ttl = self._ttl(timeout)
        return run_blocking(
            add_over_stub(self, stack.blocking, wire, data, flags, ttl, stub_seen=True)
        )

    def touch(
        self, key: Any, timeout: float | object | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        stack = self._stack or self._shared()
        if stack.tiered is not None:  # the same steps over the tier's flat path
            return stack.tiered.touch_now(self.wire_key(key, version), self._ttl(timeout))
        if not stack.flat:
            return run_blocking(self._touch(stack.blocking, key, timeout, version))
        wire = self.wire_key(key, version)
        return stack.blocking.touch_now(wire, self.get_backend_timeout(timeout))

    def delete(self, key: Any, version: int | None = None) -> bool:
        stack = self._stack or self._shared()
        if stack.tiered is not None:
            return stack.tiered.delete_now(self.wire_key(key, version))
        if not stack.flat:
            return run_blocking(self._delete(stack.blocking, key, version))
        return stack.blocking.delete_now(self.wire_key(key, version), True)

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        stack = self._stack or self._shared()
        if stack.tiered is not None or not stack.flat:
            return run_blocking(self._get_many(stack.blocking, keys, version))
        originals = {self.wire_key(key, version): key for key in keys}
        if not originals:
            return {}
        found = run_blocking(stack.blocking.get_many(originals))
        decode = self._decode
        values = {originals[w]: decode(w, item.value, item.flags) for w, item in found.items()}
        return {key: value for key, value in values.items() if value is not _REFUSED}

    def set_many(
        self,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        return run_blocking(self._set_many(self.blocking_client, data, timeout, version))

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        run_blocking(self._delete_many(self.blocking_client, keys, version))

    # (delta: Any, checked here: compiled, an argument typed int refuses anything else
    # with a TypeError before the body runs.)
    def incr(self, key: Any, delta: Any = 1, version: int | None = None) -> int:
        delta = _delta(delta)
        stack = self._stack or self._shared()
        tiered = stack.tiered
        if tiered is None and not stack.flat:
            return run_blocking(self._incr(stack.blocking, key, delta, version))
        wire = self.wire_key(key, version)
        try:
            if tiered is not None:  # the same steps over the tier's flat path
                value = tiered.incr_now(wire, delta)
            else:
                value = stack.blocking.incr_now(wire, delta, True)
        except NonIntegerValueError:
            raise
        except ClientError as exc:
            if run_blocking(is_stub_now(stack.blocking, wire)):  # a lease's stub: missing
                raise _not_found(wire) from exc
            raise _not_an_integer(wire) from exc
        if value is None:
            raise _not_found(wire)
        return value

    def decr(self, key: Any, delta: Any = 1, version: int | None = None) -> int:
        return self.incr(key, -_delta(delta), version)

    def has_key(self, key: Any, version: int | None = None) -> bool:
        stack = self._stack or self._shared()
        if stack.tiered is not None:
            wire = self.wire_key(key, version)
            found = stack.tiered.get_now(wire)
            return found is not None and self._opened(wire, found[0], found[1]) is not None
        if not stack.flat:
            return run_blocking(self._has_key(stack.blocking, key, version))
        wire = self.wire_key(key, version)
        found = stack.blocking.value_now(wire, True)
        return found is not None and self._opened(wire, found[0], found[1]) is not None

    def clear(self) -> None:
        run_blocking(self._clear(self.blocking_client))

    # -- get_or_set with stampede protection, and invalidate (see stampede.py) ------------
    def get_or_set(
        self,
        key: Any,
        default: Any = _NO_DEFAULT,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> Any:
        """Django's get_or_set; on a miss one caller computes ``default`` while the others
        wait for its value (the stampede protection options)."""
        if default is _NO_DEFAULT:  # Python's own words (compiled, the message differs)
            raise TypeError("get_or_set() missing 1 required positional argument: 'default'")
        blocking = self.blocking_client
        return run_blocking(
            _leased_get_or_set(
                self, blocking, key, default, timeout, version,
                pause=blocking_pause, refused=_REFUSED,
            )
        )  # fmt: skip

    async def aget_or_set(
        self,
        key: Any,
        default: Any = _NO_DEFAULT,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> Any:
        """:meth:`get_or_set` on the caller's event loop; ``default`` may also return an
        awaitable."""
        if default is _NO_DEFAULT:
            raise TypeError("aget_or_set() missing 1 required positional argument: 'default'")
        return await _leased_get_or_set(
            self, self.client, key, default, timeout, version,
            pause=async_pause, refused=_REFUSED, is_async=True,
        )  # fmt: skip

    def invalidate(
        self, key: Any, version: int | None = None, stale_timeout: float | None = None
    ) -> bool:
        """Delete for get_or_set, keeping a stale copy: memcached marks the value stale
        (``md … I``) and get_or_set hands one caller its recompute, serving the stale copy
        meanwhile with ``stale_while_revalidate``. Plain ``get`` still returns it until
        then. ``stale_timeout``: seconds the stale copy may live (None: its own expiry).
        With the disk tier on, the disk copy is deleted. A plain delete where the node
        does not speak meta (or, with the tier, is out)."""
        return run_blocking(_invalidate(self, self.blocking_client, key, version, stale_timeout))

    async def ainvalidate(
        self, key: Any, version: int | None = None, stale_timeout: float | None = None
    ) -> bool:
        """:meth:`invalidate` on the caller's event loop."""
        return await _invalidate(self, self.client, key, version, stale_timeout)

    def close(self, **kwargs: Any) -> None:
        """Nothing to do: connections are process-global and outlive a request."""

    # -- the async API: the same operations, awaited on the caller's event loop --------------
    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return await self._get(self.client, key, default, version)

    async def aset(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        await self._set(self.client, key, value, timeout, version)

    async def aadd(
        self,
        key: Any,
        value: Any,
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return await self._add(self.client, key, value, timeout, version)

    async def atouch(
        self, key: Any, timeout: float | object | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return await self._touch(self.client, key, timeout, version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        return await self._delete(self.client, key, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        return await self._get_many(self.client, keys, version)

    async def aset_many(
        self,
        data: Mapping[Any, Any],
        timeout: float | object | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        return await self._set_many(self.client, data, timeout, version)

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        await self._delete_many(self.client, keys, version)

    async def aincr(self, key: Any, delta: Any = 1, version: int | None = None) -> int:
        return await self._incr(self.client, key, _delta(delta), version)

    async def adecr(self, key: Any, delta: Any = 1, version: int | None = None) -> int:
        return await self._decr(self.client, key, _delta(delta), version)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self._has_key(self.client, key, version)

    async def aclear(self) -> None:
        await self._clear(self.client)

    async def aclose(self, **kwargs: Any) -> None:
        """Nothing to do: connections are process-global and outlive a request."""


__all__ = ["FastCache"]
