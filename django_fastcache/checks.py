"""System checks for FastCache caches: every option and address, and the disk tier's
directory, before the first request.

Run by ``manage.py check`` (and at server start) when ``django_fastcache`` is in
``INSTALLED_APPS``. The backend itself refuses bad options with ``ImproperlyConfigured``
when it is first used; the check reports every problem at once, with ids.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .backends.options import parse_options
from .client.address import NoServerError, parse_address, parse_locations
from .disk.location import default_directory, unsafe_reason, unwritable_reason
from .errors import ConfigurationError


def _is_fastcache(backend_path: str) -> bool:
    from .backends.fastcache import FastCache

    try:
        backend = import_string(backend_path)
    except ImportError:
        return False
    return isinstance(backend, type) and issubclass(backend, FastCache)


def _bad_location_type(alias: str, location: object) -> Error:
    # Not a string nor a list of strings: reported rather than crashing the check.
    return Error(
        f"CACHES[{alias!r}]: LOCATION must be a string or a list of strings, got {location!r}.",
        id="django_fastcache.E012",
    )


def _secret_key() -> str:
    try:
        return str(settings.SECRET_KEY or "")
    except ImproperlyConfigured:  # (Django refuses an empty one on first read)
        return ""


#: memcached's longest key, in bytes.
_MAX_KEY = 250


#: Django's own key function, named as KEY_FUNCTION may name it.
_DEFAULT_KEY_FUNCTION = "django.core.cache.backends.base.default_key_func"


def _key_prefix_problems(alias: str, config: dict[str, Any]) -> list[CheckMessage]:
    """A KEY_PREFIX (or VERSION) that makes every key invalid under Django's key function
    (``prefix:version:key``): each operation would raise InvalidCacheKey."""
    if config.get("KEY_FUNCTION") not in (None, _DEFAULT_KEY_FUNCTION):
        return []  # the project's own: its keys are its to make
    hint = "Change KEY_PREFIX, or set the hash_invalid_keys option."
    prefix, version = str(config.get("KEY_PREFIX", "")), str(config.get("VERSION", 1))
    for name, part in (("KEY_PREFIX", prefix), ("VERSION", version)):
        if not _carried(part):
            return [
                Error(
                    f"CACHES[{alias!r}]: {name} {part!r} holds characters memcached refuses"
                    " in a key (whitespace, control characters): every key would be refused"
                    " (InvalidCacheKey).",
                    hint=hint if name == "KEY_PREFIX" else f"Change {name}.",
                    id="django_fastcache.E022",
                )
            ]
    made = len(f"{prefix}:{version}:".encode())
    if made >= _MAX_KEY:
        return [
            Error(
                f"CACHES[{alias!r}]: KEY_PREFIX and VERSION make {made} bytes of every key:"
                f" with one more, every key but the empty one would be longer than"
                f" memcached's {_MAX_KEY} bytes (InvalidCacheKey).",
                hint=hint,
                id="django_fastcache.E022",
            )
        ]
    return []


def _carried(part: str) -> bool:
    """Whether memcached takes ``part`` within a key."""
    try:
        data = part.encode()
    except UnicodeEncodeError:  # lone surrogates
        return False
    return not any(byte <= 0x20 or byte == 0x7F for byte in data)


@register(Tags.caches)
def check_fastcache_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    # Each disk tier's directory: the first alias to use it, and its memcached nodes.
    tiers: dict[str, tuple[str, frozenset[str]]] = {}
    for alias, config in getattr(settings, "CACHES", {}).items():
        if not _is_fastcache(config.get("BACKEND", "")):
            continue
        options, problems = parse_options(config.get("OPTIONS"))
        for problem in problems:
            messages.append(
                Error(f"CACHES[{alias!r}]: {problem.message}", hint=problem.hint, id=problem.id)
            )
        location = config.get("LOCATION", "")
        servers: list[str] = []
        try:
            servers = parse_locations(location)
        except NoServerError as exc:
            # The backend refuses the same LOCATION on first use (ImproperlyConfigured).
            messages.append(
                Error(
                    f"CACHES[{alias!r}] has no LOCATION.",
                    hint=f"{exc}.",
                    id="django_fastcache.E011",
                )
            )
        except (ConfigurationError, TypeError):
            messages.append(_bad_location_type(alias, location))
            continue
        seen: dict[str, str] = {}  # node id -> the address that named it first
        for server in servers:
            try:
                node_id = parse_address(server).node_id
            except ConfigurationError as exc:
                messages.append(Error(f"CACHES[{alias!r}]: {exc}", id="django_fastcache.E012"))
                continue
            if node_id in seen:
                messages.append(
                    Error(
                        f"CACHES[{alias!r}]: LOCATION names the node {node_id} twice"
                        f" ({seen[node_id]!r} and {server!r}).",
                        hint="Name each memcached node once.",
                        id="django_fastcache.E012",
                    )
                )
            seen.setdefault(node_id, server)
        if not options.hash_invalid_keys:
            messages.extend(_key_prefix_problems(alias, config))
        if options.sign_values and options.signing_key is None and not _secret_key():
            messages.append(
                Error(
                    f"CACHES[{alias!r}]: values are sealed with a key from SECRET_KEY,"
                    " which is empty.",
                    hint="Set SECRET_KEY, or the signing_key option (or sign_values: False,"
                    " at the risk docs/security.md describes).",
                    id="django_fastcache.E021",
                )
            )
        if options.disk_tier:
            directory = options.disk_directory or default_directory(servers)
            reason = unsafe_reason(directory)
            if reason is not None:
                unsafe, _, fix = reason.partition(". Fix: ")
                messages.append(
                    Error(
                        f"CACHES[{alias!r}]: {unsafe}.",
                        hint=f"{fix}." if fix else "Use a directory only this user can write.",
                        id="django_fastcache.E014",
                    )
                )
            unwritable = unwritable_reason(directory)
            if unwritable is not None:
                what, _, fix = unwritable.partition(". Fix: ")
                messages.append(
                    Error(
                        f"CACHES[{alias!r}]: {what}.",
                        hint=f"{fix}.",
                        id="django_fastcache.E051",
                    )
                )
            nodes = frozenset(seen)
            first, first_nodes = tiers.setdefault(os.path.realpath(directory), (alias, nodes))
            if first_nodes != nodes:
                messages.append(
                    Error(
                        f"CACHES[{alias!r}] and CACHES[{first!r}] share the disk tier at"
                        f" {directory} over different memcached nodes: each would answer"
                        " the other's keys from disk, and hide the other's entries.",
                        hint="Give each cache a disk_directory of its own.",
                        id="django_fastcache.E052",
                    )
                )
    return messages
