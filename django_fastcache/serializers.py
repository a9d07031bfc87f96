"""Turning cache values into (bytes, flags) and back.

Flags follow the convention pymemcache and pylibmc share for the common types, so values
stay readable by those clients, and theirs by us: 0 raw bytes, 1 pickle, 2 integer (4, which
pylibmc writes for ints, is read as one too), 8 zlib-compressed (combined with the others),
16 UTF-8 text; 32 is our JSON. Non-negative integers are
stored as decimal digits so that memcached's ``incr``/``decr`` work on them.
"""

from __future__ import annotations

import json
import pickle
import zlib
from typing import Any, Final, Protocol

from .errors import ValueRefusedError, ValueTooLargeError

FLAG_BYTES: Final = 0
FLAG_PICKLE: Final = 1
FLAG_INTEGER: Final = 2
#: pylibmc stores Python ints with this flag (pymemcache's "long"): read as an integer.
FLAG_LONG: Final = 4
FLAG_ZLIB: Final = 8
FLAG_TEXT: Final = 16
FLAG_JSON: Final = 32

_MAX_RAW_INTEGER: Final = 2**64 - 1  # memcached's counters are unsigned 64-bit
_EMPTY_COMPRESSED: Final = zlib.compress(b"")


class Serializer(Protocol):
    def dumps(self, value: Any) -> tuple[bytes, int]: ...

    def loads(self, data: bytes, flags: int) -> Any: ...


#: Bytes a value may take once decompressed, unless a serializer is told otherwise.
DEFAULT_MAX_SIZE: Final = 1024 * 1024


class _BaseSerializer:
    def __init__(
        self,
        compress_min_length: int | None = None,
        compress_level: int = 6,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        self.compress_min_length = compress_min_length
        self.compress_level = compress_level
        #: The most bytes a value may have before compression, and so the most that
        #: decompressing one may produce: a small compressed value cannot inflate into
        #: gigabytes (a decompression bomb).
        self.max_size = max_size

    def dumps(self, value: Any) -> tuple[bytes, int]:
        kind = type(value)
        if kind is int and 0 <= value <= _MAX_RAW_INTEGER:
            return b"%d" % value, FLAG_INTEGER  # raw, so that incr/decr work
        if kind is bytes:
            if not value:
                # Empty bytes with flags 0 is what a get_or_set lease's stub looks like
                # (see stampede.py): written compressed, which every client reads back.
                return _EMPTY_COMPRESSED, FLAG_BYTES | FLAG_ZLIB
            data, flags = value, FLAG_BYTES
        elif kind is str:
            try:
                data, flags = value.encode(), FLAG_TEXT
            except UnicodeEncodeError:  # lone surrogates: not UTF-8, still a str to keep
                data, flags = self._dump_object(value)
        else:
            data, flags = self._dump_object(value)
        threshold = self.compress_min_length
        if threshold is not None and len(data) >= threshold:
            if len(data) > self.max_size:
                raise ValueTooLargeError(
                    f"value of {len(data)} bytes before compression exceeds max_value_size"
                    f" ({self.max_size} bytes)"
                )
            compressed = zlib.compress(data, self.compress_level)
            if len(compressed) < len(data):
                return compressed, flags | FLAG_ZLIB
        return data, flags

    def loads(self, data: bytes, flags: int) -> Any:
        if flags & FLAG_ZLIB:
            data = self._decompress(data)
            flags &= ~FLAG_ZLIB
        if flags in (FLAG_INTEGER, FLAG_LONG):
            return int(data)
        if flags == FLAG_TEXT:
            return data.decode()
        if flags == FLAG_BYTES:
            return data
        return self._load_object(data, flags)

    def _decompress(self, data: bytes) -> bytes:
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(data, self.max_size)
        except zlib.error as exc:
            raise ValueRefusedError(f"a compressed value does not decompress: {exc}") from None
        if inflater.unconsumed_tail:
            raise ValueRefusedError(
                f"a compressed value of {len(data)} bytes inflates past max_value_size"
                f" ({self.max_size} bytes)"
            )
        return out

    def _dump_object(self, value: Any) -> tuple[bytes, int]:
        raise NotImplementedError

    def _load_object(self, data: bytes, flags: int) -> Any:
        raise NotImplementedError


class PickleSerializer(_BaseSerializer):
    """The default: anything picklable. Unpicklable values raise ``pickle.PickleError``
    (or whatever ``pickle`` raises), never stored half-way."""

    def __init__(
        self,
        compress_min_length: int | None = None,
        compress_level: int = 6,
        protocol: int = pickle.HIGHEST_PROTOCOL,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        super().__init__(compress_min_length, compress_level, max_size)
        self.protocol = protocol

    def _dump_object(self, value: Any) -> tuple[bytes, int]:
        return pickle.dumps(value, self.protocol), FLAG_PICKLE

    def _load_object(self, data: bytes, flags: int) -> Any:
        if flags == FLAG_PICKLE:
            return pickle.loads(data)
        if flags == FLAG_JSON:
            return json.loads(data)
        raise ValueError(f"cannot decode a value stored with flags {flags}")


class JSONSerializer(_BaseSerializer):
    """JSON for everything that is not bytes, str or a non-negative int: no code runs on
    load, at the price of JSON's types (tuples come back as lists)."""

    def _dump_object(self, value: Any) -> tuple[bytes, int]:
        return json.dumps(value, separators=(",", ":")).encode(), FLAG_JSON

    def _load_object(self, data: bytes, flags: int) -> Any:
        if flags == FLAG_JSON:
            return json.loads(data)
        raise ValueError(
            f"refusing to decode a value stored with flags {flags} as JSON (written with"
            " another serializer: change VERSION or KEY_PREFIX with the"
            " serializer, or clear the cache)"
        )


SERIALIZERS: dict[str, type[_BaseSerializer]] = {
    "pickle": PickleSerializer,
    "json": JSONSerializer,
}
