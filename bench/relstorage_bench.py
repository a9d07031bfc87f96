"""RelStorage read workload: states read from memcached, module by module.

    python bench/relstorage_bench.py [--rounds 7] [--objects 400] [--size 600]

ZODB on RelStorage with the SQLite adapter. For each case a writer connection commits
``--objects`` new objects and a reader connection, which polled before the commit, begins a
transaction and reads every one of them: RelStorage asks memcached for each state (one
``get_multi`` per object) and goes to the database on a miss. Cases: ``cache-module-name``
set to ``django_fastcache.relstorage``, ``relstorage.pylibmc_wrapper`` and python-memcached's
``memcache``, each over TCP and over a unix socket, and no memcached at all (``cache-servers``
empty: every read goes to SQLite).

Rounds are interleaved (each round runs every case once, in a shuffled order) so machine
noise hits all cases alike; each case keeps its database, connections and key prefix. The
table gives each case's best round (the one least disturbed by the rest of the machine):
wall and process CPU µs per object read, the commit's wall µs per object (RelStorage also
writes each state to memcached then), the memcached hits per object read, and ratios to our
module over TCP.

A second table times the modules alone, as RelStorage 4.x calls them: ``get_multi`` of one
key (every state read) and ``set_multi`` of 50 states (a commit's batch), per call.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import random
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import transaction
import ZODB
from persistent.mapping import PersistentMapping
from relstorage.adapters.sqlite.adapter import Sqlite3Adapter
from relstorage.options import Options
from relstorage.storage import RelStorage

from django_fastcache.testing.servers import MemcachedServer

MODULES = {
    "fastcache": "django_fastcache.relstorage",
    "pylibmc": "relstorage.pylibmc_wrapper",
    "python-memcached": "memcache",
}


@dataclass
class Case:
    name: str
    module: str
    servers: list[str]
    stats_address: tuple[str, int] | str | None
    directory: str
    writer: ZODB.DB | None = None
    reader: ZODB.DB | None = None
    rounds: list[dict[str, float]] = field(default_factory=list)

    def open(self) -> None:
        self.writer = open_db(self.directory, self.module, self.servers, self.name)
        self.reader = open_db(self.directory, self.module, self.servers, self.name)
        self.write_tm = transaction.TransactionManager()
        self.read_tm = transaction.TransactionManager()
        self.write_conn = self.writer.open(transaction_manager=self.write_tm)
        self.read_conn = self.reader.open(transaction_manager=self.read_tm)
        self.write_root = self.write_conn.root()
        self.write_root["setup"] = 0
        self.write_tm.commit()
        self.read_tm.begin()
        self.read_root = self.read_conn.root()
        assert self.read_root["setup"] == 0
        self.serial = 0

    def round(self, count: int, size: int) -> None:
        self.serial += 1
        names = [f"r{self.serial}-{n}" for n in range(count)]
        self.read_tm.begin()  # polled before the commit
        started = time.perf_counter()
        for name in names:
            self.write_root[name] = PersistentMapping(data=random.randbytes(size))
        self.write_tm.commit()
        commit = time.perf_counter() - started
        hits_before = get_hits(self.stats_address)
        self.read_tm.begin()  # learns the new tids
        cpu, wall = time.process_time(), time.perf_counter()
        root = self.read_root
        total = 0
        for name in names:
            total += len(root[name]["data"])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert total == count * size
        self.rounds.append(
            {
                "wall": wall / count * 1e6,
                "cpu": cpu / count * 1e6,
                "commit": commit / count * 1e6,
                "hits": (get_hits(self.stats_address) - hits_before) / count,
            }
        )
        # Ghostify what was read so memory stays flat across rounds.
        self.read_conn.cacheMinimize()
        self.write_conn.cacheMinimize()

    def best(self, what: str) -> float:
        return min(r[what] for r in self.rounds)

    def close(self) -> None:
        for db in (self.writer, self.reader):
            if db is not None:
                db.close()


def open_db(directory: str, module: str, servers: list[str], prefix: str) -> ZODB.DB:
    options = Options(cache_servers=servers, cache_module_name=module, cache_prefix=prefix)
    return ZODB.DB(RelStorage(Sqlite3Adapter(directory, {}, options=options), options=options))


def get_hits(address: tuple[str, int] | str | None) -> int:
    if address is None:
        return 0
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += sock.recv(65536)
    for line in data.split(b"\r\n"):
        parts = line.split()
        if len(parts) == 3 and parts[1] == b"get_hits":
            return int(parts[2])
    raise RuntimeError("no get_hits in stats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--objects", type=int, default=400, help="objects per round")
    parser.add_argument("--size", type=int, default=600, help="bytes of data per object")
    parser.add_argument("--calls", type=int, default=5000, help="calls per round, modules alone")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="relstorage-bench-") as workdir:
        tcp = MemcachedServer(memory_mb=256).start()
        unix = MemcachedServer(os.path.join(workdir, "mc.sock"), memory_mb=256).start()
        try:
            assert unix.socket_path is not None
            spellings = {
                # Each module's usual spelling of a unix socket.
                "fastcache": unix.socket_path,
                "pylibmc": unix.socket_path,
                "python-memcached": f"unix:{unix.socket_path}",
            }
            cases: list[Case] = []
            for label, module in MODULES.items():
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    print(f"skipping {label}: {exc}")
                    continue
                for transport in ("tcp", "unix"):
                    if transport == "tcp":
                        servers, address = [tcp.location], (tcp.host, tcp.port)
                    else:
                        servers, address = [spellings[label]], unix.socket_path
                    name = f"{label}-{transport}"
                    directory = os.path.join(workdir, name)
                    cases.append(Case(name, module, servers, address, directory))
            directory = os.path.join(workdir, "none")
            cases.append(Case("no-memcached", MODULES["fastcache"], [], None, directory))
            calls = module_calls(tcp, spellings, args)
            for case in cases:
                case.open()
                case.round(args.objects // 4, args.size)  # warm-up, not counted
                case.rounds.clear()
            for _ in range(args.rounds):
                random.shuffle(cases)
                for case in cases:
                    case.round(args.objects, args.size)
            report(cases, args)
            report_calls(calls, args)
            for case in cases:
                case.close()
        finally:
            tcp.stop()
            unix.stop()


def report(cases: list[Case], args: argparse.Namespace) -> None:
    from importlib.metadata import version

    order = [f"{label}-{t}" for label in MODULES for t in ("tcp", "unix")] + ["no-memcached"]
    by_name = {case.name: case for case in cases}
    base = by_name["fastcache-tcp"]
    print(
        f"RelStorage {version('RelStorage')}, ZODB {version('ZODB')}, "
        f"Python {platform.python_version()}; {args.rounds} interleaved rounds of "
        f"{args.objects} objects ({args.size}-byte data), best round"
    )
    print()
    print(
        "| case | read wall µs/object | read CPU µs/object | wall / fastcache-tcp "
        "| CPU / fastcache-tcp | commit µs/object | memcached hits/object |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in order:
        case = by_name.get(name)
        if case is None:
            continue
        wall, cpu = case.best("wall"), case.best("cpu")
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / base.best('wall'):.2f} "
            f"| {cpu / base.best('cpu'):.2f} | {case.best('commit'):.1f} "
            f"| {case.best('hits'):.2f} |"
        )


def module_calls(
    tcp: MemcachedServer, unix_spellings: dict[str, str], args: argparse.Namespace
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per call (wall µs, CPU µs) of get_multi and set_multi, by module and transport."""
    clients = {}
    for label, module_name in MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        clients[f"{label}-tcp"] = module.Client([tcp.location])
        clients[f"{label}-unix"] = module.Client([unix_spellings[label]])
    key = "bench:state:285753216455680000:42"
    value = random.randbytes(8 + args.size)
    batch = {f"bench:state:285753216455680001:{n}": value for n in range(50)}
    timings: dict[str, dict[str, list[tuple[float, float]]]] = {
        name: {"get_multi": [], "set_multi": []} for name in clients
    }
    names = list(clients)
    for _ in range(args.rounds):
        random.shuffle(names)
        for name in names:
            client = clients[name]
            client.set(key, value)
            assert client.get_multi([key]) == {key: value}, name
            for what, call, count in (
                ("get_multi", lambda c=client: c.get_multi([key]), args.calls),
                ("set_multi", lambda c=client: c.set_multi(batch), args.calls // 50),
            ):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(count):
                    call()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                timings[name][what].append((wall / count * 1e6, cpu / count * 1e6))
    for client in clients.values():
        client.disconnect_all()
    return timings


def report_calls(
    timings: dict[str, dict[str, list[tuple[float, float]]]], args: argparse.Namespace
) -> None:
    print()
    print(
        f"The modules alone: {args.rounds} interleaved rounds of {args.calls} get_multi calls "
        f"(one key, {args.size + 8}-byte value) and {args.calls // 50} set_multi calls "
        "(50 values), best round, µs per call"
    )
    print()
    print(
        "| module | get_multi wall | get_multi CPU | CPU / fastcache-tcp "
        "| set_multi wall | set_multi CPU | CPU / fastcache-tcp |"
    )
    print("|---|---|---|---|---|---|---|")

    def best(name: str, what: str, index: int) -> float:
        return min(t[index] for t in timings[name][what])

    for name in [f"{label}-{t}" for label in MODULES for t in ("tcp", "unix")]:
        if name not in timings:
            continue
        get_cpu, set_cpu = best(name, "get_multi", 1), best(name, "set_multi", 1)
        print(
            f"| {name} | {best(name, 'get_multi', 0):.1f} | {get_cpu:.1f} "
            f"| {get_cpu / best('fastcache-tcp', 'get_multi', 1):.2f} "
            f"| {best(name, 'set_multi', 0):.1f} | {set_cpu:.1f} "
            f"| {set_cpu / best('fastcache-tcp', 'set_multi', 1):.2f} |"
        )


if __name__ == "__main__":
    main()
