"""FastCache's ``OPTIONS``: defaults, meaning and validation in one place.

:func:`parse_options` is shared by the backend (which refuses to start with bad options)
and by the system check (which reports every problem at once, with an id).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import pickle
import ssl as _ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..client.placement import PLACEMENTS
from ..client.security import TLSOptions, check_credentials, normalize_tls
from ..errors import ConfigurationError
from ..serializers import SERIALIZERS


@dataclass(frozen=True)
class FastCacheOptions:
    # -- the memcached client --------------------------------------------------------
    #: Seconds a single operation may take, waiting for a connection included.
    operation_timeout: float = 1.0
    #: Seconds to open a connection.
    connect_timeout: float = 1.0
    #: Connections per node and event loop kept open even when idle.
    min_connections: int = 1
    #: Connections per node and event loop at most; further callers wait their turn.
    max_connections: int = 4
    #: Seconds an idle connection (beyond ``min_connections``) is kept.
    idle_timeout: float = 60.0
    #: Largest value sent, in bytes after serialization; memcached's ``-I`` (1 MiB default).
    #: Larger values are refused without a round trip, and the key's old value is deleted.
    max_value_size: int = 1024 * 1024
    #: How keys are placed on nodes: ``"rendezvous"`` (FastCache's own), or as another client
    #: places them (``"ketama"``, ``"ketama_md5"``, ``"ketama_weighted"``: pylibmc's ketama
    #: behaviours; ``"emcache"``), so a cache that client filled stays warm. docs/placement.md.
    placement: str = "rendezvous"
    #: The async API (``aget`` …): concurrent ``aget`` calls of one event-loop iteration
    #: for one node go out as one ``get k1 k2 …`` request. docs/async-client.md.
    autobatching: bool = True
    #: The async API: concurrent requests for one node share connections, pipelined,
    #: rather than each waiting for a connection of its own. docs/async-client.md.
    pipelining: bool = True
    #: LOCATION names configuration endpoints (ElastiCache, Memorystore) whose node list
    #: ``config get cluster`` reads, and keeps current in the background.
    autodiscovery: bool = False
    #: Seconds between two reads of the node list.
    autodiscovery_interval: float = 60.0
    #: TLS to memcached's TCP nodes: an ``ssl.SSLContext``, True (the system's CAs), or a
    #: dict of ``ca_file``, ``cert_file``, ``key_file``, ``server_hostname``,
    #: ``check_hostname`` (kept as :class:`TLSOptions`). None: plain TCP. docs/security.md.
    ssl: _ssl.SSLContext | TLSOptions | None = None
    #: memcached's ASCII authentication (``-Y``): sent once by every new connection.
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # -- values and keys ---------------------------------------------------------------
    #: ``"pickle"`` or ``"json"``.
    serializer: str = "pickle"
    #: Pickle protocol for the pickle serializer.
    pickle_protocol: int = pickle.HIGHEST_PROTOCOL
    #: Compress values of at least this many bytes with zlib; None: never.
    compress_min_length: int | None = None
    #: zlib level, 1 (fast) to 9 (small).
    compress_level: int = 6
    #: Replace keys memcached cannot carry (over 250 bytes, or with spaces or control
    #: characters) by a digest instead of raising ``InvalidCacheKey``.
    hash_invalid_keys: bool = False
    #: Seal every value (but raw integers) with a keyed BLAKE2b tag over key and value, and
    #: load only values whose tag checks out: a value planted in memcached or on disk, or
    #: moved from another key, is a logged miss and is never unpickled. See docs/security.md.
    sign_values: bool = True
    #: The secret the tags are keyed from; None: ``settings.SECRET_KEY``.
    signing_key: str | None = None
    #: Latency histograms in ``metrics()`` (a clock read and a bucket per call, measured at
    #: several percent of a get's CPU: off unless asked for). Counts are always kept.
    latency_metrics: bool = False

    # -- the disk tier ---------------------------------------------------------------
    #: Keep a local disk tier (sharded SQLite) behind memcached.
    disk_tier: bool = True
    #: Its directory; None: one derived from LOCATION under the user's cache directory
    #: (``$XDG_CACHE_HOME`` or ``~/.cache``, else the temp directory), created 0700.
    disk_directory: str | None = None
    #: SQLite shards.
    disk_shards: int = 8
    #: Bytes the disk tier may hold before it evicts.
    disk_size_limit: int = 1024**3
    #: Which entries go first when it is full.
    disk_eviction_policy: str = "least-recently-stored"
    #: Seconds SQLite waits for a lock before a disk operation gives up (and is retried
    #: or let go; a request is never failed by the disk tier).
    disk_timeout: float = 0.010
    #: Seconds after its write a disk entry may still answer a memcached miss or an outage.
    #: Bounds how stale an answer can be across hosts (see the disk tier docs).
    disk_max_staleness: float = 300.0
    #: Bytes each process keeps in memory, per cache, as copies of the disk entries it
    #: read: a copy answers in place of a SQLite read while its entry would (the key's
    #: write stamp unchanged; see the disk tier docs). 0: none (and none are kept under an
    #: eviction policy that counts reads).
    disk_read_copies: int = 4 * 1024**2
    #: Seconds a write made while its node is up waits in this process's queue before its
    #: disk copy lands (the disk tier's lag behind memcached; ``MIN_AGE`` in
    #: ``django_fastcache/disk/writebehind.py``). A key written again meanwhile, by any
    #: process on the host, lands once. Longer: fewer rows written, more keys missing on
    #: disk after a crash or at an outage's start (never older values). Below
    #: ``disk_max_staleness``.
    disk_write_delay: float = 3.0

    # -- the meta protocol and stampede protection (docs/stampede.md) ----------------
    #: ``"auto"`` (ask each node with ``mn`` the first time it is needed), ``"meta"``
    #: (memcached 1.6+, no probe) or ``"classic"`` (older servers, proxies such as mcrouter):
    #: whether get_or_set may use memcached's meta commands. Plain get/set stay classic.
    protocol: str = "auto"
    #: get_or_set/aget_or_set hand one caller per key a lease to recompute a missing value
    #: while the others wait for it (when the key's node speaks meta).
    stampede_protection: bool = True
    #: Seconds a lease lasts: how long a winner may take to compute before another caller
    #: may take over, and how soon a winner that died stops holding everyone up.
    stampede_lease: float = 10.0
    #: Seconds a caller waits for another's lease before computing the value itself.
    stampede_wait: float = 15.0
    #: Seconds before a value expires during which get_or_set hands one caller the
    #: recompute while every other caller still gets the current value at once; also lets
    #: callers take a value marked stale by ``invalidate()`` at once. 0: off.
    stale_while_revalidate: float = 0.0
    #: Seconds ``delete`` keeps a stale copy for get_or_set (``md … I``) instead of removing
    #: the value: every other operation takes the key for missing at once, while
    #: get_or_set hands one caller the recompute and, with stale_while_revalidate, serves
    #: the copy meanwhile. Needs the disk tier off and a node that speaks meta. 0: off.
    stale_on_delete: float = 0.0


EVICTION_POLICIES = (
    "least-recently-stored",
    "least-recently-used",
    "least-frequently-used",
    "none",
)

PROTOCOLS = ("auto", "meta", "classic")

OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(FastCacheOptions))


@dataclass(frozen=True)
class OptionProblem:
    id: str
    message: str
    hint: str | None = None


def _is_number(value: Any) -> bool:
    # Finite only: an infinite timeout overflows the socket and event loop timers.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Options other memcached backends take, and what FastCache calls the same idea.
_FOREIGN_NAMES = {
    "timeout": "operation_timeout",
    "socket_timeout": "operation_timeout",
    "max_pool_size": "max_connections",
    "pool_size": "max_connections",
    "serde": "serializer",
}

# Django's own keys of a CACHES entry, sometimes put inside OPTIONS by mistake.
_CACHE_SETTINGS = frozenset(
    {"BACKEND", "LOCATION", "TIMEOUT", "KEY_PREFIX", "VERSION", "KEY_FUNCTION"}
)


def _unknown_option(name: object) -> OptionProblem:
    """E001, naming the nearest known option when there is one close enough."""
    if name in _CACHE_SETTINGS:
        return OptionProblem(
            "django_fastcache.E001",
            f"{name!r} is a cache setting, not an option: put it beside OPTIONS, not inside.",
            f'CACHES = {{"default": {{"BACKEND": ..., "LOCATION": ..., "{name}": ...}}}}',
        )
    nearest: list[str] = []
    if isinstance(name, str):
        key = name.lower()
        if key in OPTION_NAMES:
            nearest = [key]
        elif key in _FOREIGN_NAMES:
            nearest = [_FOREIGN_NAMES[key]]
        else:
            nearest = difflib.get_close_matches(key, sorted(OPTION_NAMES), n=1, cutoff=0.6)
    if nearest:
        return OptionProblem(
            "django_fastcache.E001",
            f"Unknown FastCache option {name!r}; did you mean {nearest[0]!r}?",
            f"Rename it to {nearest[0]!r}; the configuration reference lists every option.",
        )
    return OptionProblem(
        "django_fastcache.E001",
        f"Unknown FastCache option {name!r}.",
        "Known options: " + ", ".join(sorted(OPTION_NAMES)) + ".",
    )


def parse_options(raw: Mapping[str, Any] | None) -> tuple[FastCacheOptions, list[OptionProblem]]:
    """Options from a ``CACHES[...]["OPTIONS"]`` dict, and every problem found in it."""
    if raw is not None and not isinstance(raw, Mapping):
        problem = OptionProblem(
            "django_fastcache.E009", f"OPTIONS must be a dict, got {type(raw).__name__}."
        )
        return FastCacheOptions(), [problem]
    raw = dict(raw or {})
    problems: list[OptionProblem] = []
    unknown = sorted(set(raw) - OPTION_NAMES, key=repr)
    for name in unknown:
        problems.append(_unknown_option(name))
        raw.pop(name)

    def positive_number(name: str) -> None:
        if name in raw and not (_is_number(raw[name]) and raw[name] > 0):
            problems.append(
                OptionProblem("django_fastcache.E002", f"{name} must be a positive number.")
            )
            raw.pop(name)

    def positive_int(name: str) -> None:
        if name in raw and not (_is_int(raw[name]) and raw[name] > 0):
            problems.append(
                OptionProblem("django_fastcache.E003", f"{name} must be a positive integer.")
            )
            raw.pop(name)

    def boolean(name: str) -> None:
        if name in raw and not isinstance(raw[name], bool):
            problems.append(
                OptionProblem("django_fastcache.E004", f"{name} must be True or False.")
            )
            raw.pop(name)

    for name in (
        "operation_timeout",
        "connect_timeout",
        "idle_timeout",
        "disk_timeout",
        "disk_max_staleness",
        "disk_write_delay",
        "autodiscovery_interval",
        "stampede_lease",
        "stampede_wait",
    ):
        positive_number(name)
    for name in (
        "min_connections",
        "max_connections",
        "max_value_size",
        "disk_shards",
        "disk_size_limit",
    ):
        positive_int(name)
    boolean("hash_invalid_keys")
    boolean("disk_tier")
    boolean("sign_values")
    boolean("latency_metrics")
    boolean("autodiscovery")
    boolean("autobatching")
    boolean("pipelining")
    if "placement" in raw and raw["placement"] not in PLACEMENTS:
        problems.append(
            OptionProblem(
                "django_fastcache.E031",
                f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, got"
                f" {raw['placement']!r}.",
                "'ketama' matches pylibmc's behaviors={'ketama': True}; see the placement docs.",
            )
        )
        raw.pop("placement")
    if raw.get("autodiscovery") and raw.get("disk_tier", True):
        problems.append(
            OptionProblem(
                "django_fastcache.E032",
                "autodiscovery needs the disk tier off: its node states follow a fixed node list.",
                'Add "disk_tier": False to OPTIONS.',
            )
        )
        raw.pop("autodiscovery")
    boolean("stampede_protection")
    if "protocol" in raw and raw["protocol"] not in PROTOCOLS:
        problems.append(
            OptionProblem(
                "django_fastcache.E016",
                f"protocol must be one of {', '.join(map(repr, PROTOCOLS))}, got"
                f" {raw['protocol']!r}.",
                "'auto' asks each node once; 'classic' for servers or proxies without the"
                " meta protocol (memcached before 1.6, mcrouter).",
            )
        )
        raw.pop("protocol")

    def not_negative(name: str, kind: Callable[[Any], bool], code: str, message: str) -> None:
        if name in raw and not (kind(raw[name]) and raw[name] >= 0):
            problems.append(OptionProblem(code, message))
            raw.pop(name)

    not_negative(
        "stale_while_revalidate",
        _is_number,
        "django_fastcache.E017",
        "stale_while_revalidate must be a number of seconds >= 0 (0: off).",
    )
    not_negative(
        "disk_read_copies",
        _is_int,
        "django_fastcache.E020",
        "disk_read_copies must be a number of bytes >= 0 (0: no copies kept).",
    )
    not_negative(
        "stale_on_delete",
        _is_number,
        "django_fastcache.E018",
        "stale_on_delete must be a number of seconds >= 0 (0: off).",
    )
    if raw.get("stale_on_delete", 0) > 0:
        if raw.get("disk_tier", True):
            problems.append(
                OptionProblem(
                    "django_fastcache.E019",
                    "stale_on_delete needs the disk tier off: the tier's reads do not see"
                    " memcached's stale mark.",
                    'Add "disk_tier": False to OPTIONS, or use invalidate() where a stale'
                    " copy is wanted.",
                )
            )
            raw.pop("stale_on_delete")
        elif raw.get("protocol") == "classic":
            problems.append(
                OptionProblem(
                    "django_fastcache.E019",
                    "stale_on_delete needs the meta protocol, but protocol is 'classic'.",
                    "Set protocol to 'auto' or 'meta', or stale_on_delete to 0.",
                )
            )
            raw.pop("stale_on_delete")
    if "disk_write_delay" in raw and raw["disk_write_delay"] >= raw.get(
        "disk_max_staleness", FastCacheOptions.disk_max_staleness
    ):
        problems.append(
            OptionProblem(
                "django_fastcache.E053",
                "disk_write_delay must be below disk_max_staleness: a disk copy landed"
                " after that long would never answer.",
                f"Lower disk_write_delay ({FastCacheOptions.disk_write_delay} by default) or raise"
                " disk_max_staleness.",
            )
        )
        raw.pop("disk_write_delay")
    if "ssl" in raw:
        try:
            raw["ssl"] = normalize_tls(raw["ssl"])
        except ConfigurationError as exc:
            problems.append(
                OptionProblem(
                    "django_fastcache.E041",
                    f"{exc}.",
                    'For example "ssl": {"ca_file": "/etc/ssl/memcached-ca.pem"}; '
                    "see the security docs.",
                )
            )
            raw.pop("ssl")
    if "username" in raw or "password" in raw:
        try:
            check_credentials(raw.get("username"), raw.get("password"))
        except ConfigurationError as exc:
            problems.append(OptionProblem("django_fastcache.E042", f"{exc}."))
            raw.pop("username", None)
            raw.pop("password", None)
    if "signing_key" in raw and not (
        raw["signing_key"] is None or (isinstance(raw["signing_key"], str) and raw["signing_key"])
    ):
        problems.append(
            OptionProblem(
                "django_fastcache.E015",
                "signing_key must be a non-empty string (or None for SECRET_KEY).",
            )
        )
        raw.pop("signing_key")

    if raw.get("min_connections", 1) > raw.get("max_connections", 4):
        problems.append(
            OptionProblem(
                "django_fastcache.E005", "min_connections must not exceed max_connections."
            )
        )
        raw.pop("min_connections")
    if "serializer" in raw and not (
        isinstance(raw["serializer"], str) and raw["serializer"] in SERIALIZERS
    ):
        problems.append(
            OptionProblem(
                "django_fastcache.E006",
                f"serializer must be one of {', '.join(map(repr, SERIALIZERS))}.",
            )
        )
        raw.pop("serializer")
    if "pickle_protocol" in raw and not (
        _is_int(raw["pickle_protocol"]) and 0 <= raw["pickle_protocol"] <= pickle.HIGHEST_PROTOCOL
    ):
        problems.append(
            OptionProblem(
                "django_fastcache.E007",
                f"pickle_protocol must be an integer from 0 to {pickle.HIGHEST_PROTOCOL}.",
            )
        )
        raw.pop("pickle_protocol")
    if "compress_min_length" in raw and raw["compress_min_length"] is not None:
        positive_int("compress_min_length")
    if "compress_level" in raw and not (
        _is_int(raw["compress_level"]) and 1 <= raw["compress_level"] <= 9
    ):
        problems.append(
            OptionProblem("django_fastcache.E008", "compress_level must be an integer 1-9.")
        )
        raw.pop("compress_level")
    if "disk_eviction_policy" in raw and raw["disk_eviction_policy"] not in EVICTION_POLICIES:
        problems.append(
            OptionProblem(
                "django_fastcache.E010",
                f"disk_eviction_policy must be one of {', '.join(EVICTION_POLICIES)}.",
            )
        )
        raw.pop("disk_eviction_policy")
    if raw.get("disk_directory") is not None:
        directory = _absolute_path(raw["disk_directory"])
        if directory is None:
            problems.append(
                OptionProblem(
                    "django_fastcache.E013",
                    "disk_directory must be an absolute path (a str or a path object), got"
                    f" {raw['disk_directory']!r}: a relative one would be taken from each"
                    " process's working directory, and processes started from different"
                    " directories would keep disk tiers of their own, each answering"
                    " memcached's misses with values the others overwrote. Use, say,"
                    ' BASE_DIR / "fastcache".',
                )
            )
            raw.pop("disk_directory")
        else:
            raw["disk_directory"] = directory
    return FastCacheOptions(**raw), problems


def _absolute_path(value: object) -> str | None:
    """``value`` as an absolute path string, or None when it is not one."""
    if not isinstance(value, (str, os.PathLike)):
        return None
    path = os.fspath(value)
    return path if isinstance(path, str) and os.path.isabs(path) else None
