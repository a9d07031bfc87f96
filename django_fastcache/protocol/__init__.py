"""memcached's text protocol without any I/O: key checks, request encoders, reply parser.

Nothing here touches sockets, event loops or clocks; the client layer moves the bytes.
"""

from __future__ import annotations

from django_fastcache.protocol.commands import (
    cache_memlimit_command,
    cas_command,
    decr_command,
    delete_command,
    flush_all_command,
    gat_command,
    get_command,
    incr_command,
    stats_command,
    storage_command,
    touch_command,
    verbosity_command,
    version_command,
)
from django_fastcache.protocol.keys import MAX_KEY_LENGTH, key_problem, validate_key
from django_fastcache.protocol.meta import (
    MetaReply,
    MetaResult,
    MetaStatus,
    MetaUnsupportedError,
    meta_arithmetic_command,
    meta_delete_command,
    meta_get_command,
    meta_get_many_command,
    meta_noop_command,
    meta_set_command,
    read_meta_replies,
)
from django_fastcache.protocol.parser import Item, Reply, ReplyKind, ReplyParser, Status

__all__ = [
    "MAX_KEY_LENGTH",
    "Item",
    "MetaReply",
    "MetaResult",
    "MetaStatus",
    "MetaUnsupportedError",
    "Reply",
    "ReplyKind",
    "ReplyParser",
    "Status",
    "cache_memlimit_command",
    "cas_command",
    "decr_command",
    "delete_command",
    "flush_all_command",
    "gat_command",
    "get_command",
    "incr_command",
    "key_problem",
    "meta_arithmetic_command",
    "meta_delete_command",
    "meta_get_command",
    "meta_get_many_command",
    "meta_noop_command",
    "meta_set_command",
    "read_meta_replies",
    "stats_command",
    "storage_command",
    "touch_command",
    "validate_key",
    "verbosity_command",
    "version_command",
]
