"""A ZODB process on RelStorage (SQLite adapter) that a test drives over stdin/stdout.

Started as ``python -c "from tests.integration.relstorage_worker import main; main()"
<data_dir> <cache_module> <server>...`` (so the classes below pickle under this module's
name in every process). Each request is one JSON line, each answer one JSON line with the
seconds the request took; values travel base64-encoded.

Requests: ``{"op": "begin"}`` starts a transaction (RelStorage polls the database);
``{"op": "write", "objects": {name: b64}}`` stores each value as ``root[name]["data"]`` and
commits, answering each object's oid and tid; ``{"op": "write_empty", "names": [...]}``
stores objects without attributes; ``{"op": "read", "names": [...]}`` answers each object's
value (None for an attribute-less object); ``{"op": "close"}`` ends the process.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

import transaction
import ZODB
from persistent import Persistent
from persistent.mapping import PersistentMapping
from relstorage.adapters.sqlite.adapter import Sqlite3Adapter
from relstorage.options import Options
from relstorage.storage import RelStorage
from ZODB.utils import u64

#: The cache-prefix every worker uses, so tests can name the keys RelStorage writes.
PREFIX = "fctest"


class Empty(Persistent):
    """An object without attributes: the smallest state ZODB writes."""


def open_database(data_dir: str, module: str, servers: list[str]) -> ZODB.DB:
    options = Options(
        cache_servers=servers,
        cache_module_name=module,
        cache_prefix=PREFIX,
        # The local cache stays on (RelStorage's default); objects read here are new to it.
    )
    adapter = Sqlite3Adapter(data_dir, {}, options=options)
    return ZODB.DB(RelStorage(adapter, options=options))


def main() -> None:
    data_dir, module, *servers = sys.argv[1:]
    db = open_database(data_dir, module, servers)
    manager = transaction.TransactionManager()
    connection = db.open(transaction_manager=manager)
    root = connection.root()
    for line in sys.stdin:
        request = json.loads(line)
        started = time.monotonic()
        answer: dict[str, Any] = {}
        op = request["op"]
        if op == "begin":
            manager.begin()
        elif op == "write":
            written = []
            for name, encoded in request["objects"].items():
                root[name] = PersistentMapping(data=base64.b64decode(encoded))
                written.append(root[name])
            manager.commit()
            answer["ids"] = {
                name: [u64(obj._p_oid), u64(obj._p_serial)]
                for name, obj in zip(request["objects"], written)
            }
        elif op == "write_empty":
            for name in request["names"]:
                root[name] = Empty()
            manager.commit()
        elif op == "read":
            values: dict[str, str | None] = {}
            for name in request["names"]:
                obj = root[name]
                if isinstance(obj, Empty):
                    obj._p_activate()
                    values[name] = None
                else:
                    values[name] = base64.b64encode(obj["data"]).decode("ascii")
            answer["values"] = values
        elif op == "close":
            manager.abort()
            connection.close()
            db.close()
            print(json.dumps({"elapsed": time.monotonic() - started}), flush=True)
            return
        else:
            raise ValueError(f"unknown request {op!r}")
        answer["elapsed"] = time.monotonic() - started
        print(json.dumps(answer), flush=True)
