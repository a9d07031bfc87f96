"""Instructions and system calls per call: the client's own cost, free of machine noise.

    python bench/instructions_per_call.py [--only get,set] [--subjects BlockingClient,pylibmc]

CPU time per call (``bench/cpu_per_call.py``) is what a call costs, but on a shared 2-vCPU
VM it moves by 2x from one run to the next. This script counts instead:

* **user-space instructions per call**, with valgrind's callgrind: every instruction the
  process executes outside the kernel (Python, the client, libc). The count repeats to the
  last digit whatever else the machine is doing, so a change of a few hundred instructions
  shows. Each case runs twice in a fresh process under callgrind, with N1 and N2 calls after
  the same warm-up; the difference divided by N2 - N1 is the cost of one call, start-up
  excluded.
* **system calls per call**, with ``strace -c`` the same way. The kernel's share of a call
  (most of it, for a loopback round trip) is paid per system call, and every client pays
  the same for a ``sendto`` and a ``recvfrom``: the count is what differs.

The subjects and operations are ``bench/cpu_per_call.py``'s (this script builds its cases),
against one memcached this script starts. Needs ``valgrind`` and ``strace`` on PATH.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cpu_per_call

DEFAULT_SUBJECTS = (
    "raw pylibmc",
    "raw FastCache BlockingClient",
    "django PyLibMCCache",
    "django FastCache",
    "django FastCache unsealed",
)
DEFAULT_OPERATIONS = ("get", "get_miss", "set", "delete", "incr")
WARM_UP = 300


def _calls(location: str, subject: str) -> dict[str, Callable[[], object]]:
    """The operations of one subject, as ``bench/cpu_per_call.py`` runs them (only this
    subject is built: under callgrind every line of set-up costs fifty times over)."""
    value, text = cpu_per_call.VALUE, cpu_per_call.TEXT_VALUE
    if subject == "raw pylibmc":
        import pylibmc

        mc = pylibmc.Client([location])
        mc.set("raw0", value)
        mc.set("counter", 1)
        return {
            "get": lambda: mc.get("raw0"),
            "get_miss": lambda: mc.get("absent"),
            "set": lambda: mc.set("raw1", value),
            "delete": lambda: mc.delete("absent"),
            "incr": lambda: mc.incr("counter"),
        }
    if subject == "raw FastCache BlockingClient":
        from django_fastcache.client import Client
        from django_fastcache.client.blocking import BlockingClient

        fast = BlockingClient(Client([location], timeout=30, connect_timeout=30).cluster)
        fast.store_now(b"set", b"raw0", value, 0, 0)
        fast.store_now(b"set", b"counter", b"1", 0, 0)
        return {
            "get": lambda: fast.get_now(b"raw0"),
            "get_miss": lambda: fast.get_now(b"absent"),
            "set": lambda: fast.store_now(b"set", b"raw1", value, 0, 0),
            "delete": lambda: fast.delete_now(b"absent"),
            "incr": lambda: fast.incr_now(b"counter", 1),
        }
    if subject.startswith("django "):
        from django.conf import settings
        from django.core.cache import caches

        # Under callgrind a call runs fifty times slower: no timeouts meant for real time.
        for alias in settings.CACHES.values():
            if alias["BACKEND"].startswith("django_fastcache"):
                alias["OPTIONS"].update(operation_timeout=30.0, connect_timeout=30.0)

        cache = caches[subject.removeprefix("django ")]
        cache.set("k0", text)
        cache.set("counter", 1)
        return {
            "get": lambda: cache.get("k0"),
            "get_miss": lambda: cache.get("absent"),
            "set": lambda: cache.set("k1", text),
            "delete": lambda: cache.delete("absent"),
            "incr": lambda: cache.incr("counter"),
        }
    raise SystemExit(f"unknown subject {subject!r}")


def _settle(subject: str) -> None:
    """Let the disk tier's threads finish their start-up (the writer behind opens the
    shards on its first batch) before the counted calls, which they would otherwise share
    the interpreter with; and hold off the tier's check of its files for them.

    A call checks that the tier's files are still the directory's once the last check is
    0.1 s of wall time old (``tiered.FILES_CHECK_INTERVAL``): about one call in 400 at
    cachebench's pace, where it adds well under a line or an instruction per call. Under
    valgrind a call takes fifty times longer, and more with the cold-lines count's eviction
    pass before each call: the check then ran in one call of two, and counted about 43
    lines a get and 52 a set that a worker does not pay."""
    if not subject.startswith("django "):
        return
    from django.core.cache import caches

    shared = getattr(caches[subject.removeprefix("django ")], "_shared", None)
    tiered = None if shared is None else shared().tiered
    if tiered is not None:
        tiered.flush(60.0)
        tiered._files_due = math.inf


def worker(location: str, subject: str, operation: str, calls: int) -> None:
    """Build the one case asked for, warm it up, then run it ``calls`` times."""
    directory = tempfile.mkdtemp(prefix="fastcache-instructions-")
    try:
        cpu_per_call.configure_django(location, directory, None)
        call = _calls(location, subject)[operation]
        for _ in range(WARM_UP):
            call()
        _settle(subject)
        for _ in range(calls):
            call()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _worker_command(
    location: str, subject: str, operation: str, calls: int, script: str = __file__
) -> list[str]:
    """The command of one worker run: ``script`` (this one, or another script that runs
    these cases its own way) with ``--worker``."""
    return [
        sys.executable,
        os.path.abspath(script),
        "--worker",
        location,
        subject,
        operation,
        str(calls),
    ]


def instructions(
    location: str, subject: str, operation: str, calls: int, calling_thread: bool = False
) -> int:
    """The instructions of a run; ``calling_thread``: of the thread making the calls only
    (not the disk tier's writer and maintenance threads, whose batches come and go)."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={os.path.join(out, 'run')}",
            f"--separate-threads={'yes' if calling_thread else 'no'}",
            *_worker_command(location, subject, operation, calls),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind run failed for {subject} / {operation}:\n{done.stderr}")
        if not calling_thread:
            return int(found.group(1))
        # Thread 1 (the main thread, which makes the calls) is written to "run-01".
        with open(os.path.join(out, "run-01")) as main_thread:
            for line in main_thread:
                if line.startswith("summary:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no summary in callgrind's output for {subject} / {operation}")


def system_calls(location: str, subject: str, operation: str, calls: int) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".strace") as summary:
        command = [
            "strace",
            "-f",
            "-c",
            "-o",
            summary.name,
            *_worker_command(location, subject, operation, calls),
        ]
        subprocess.run(command, capture_output=True, check=True)
        counts: dict[str, int] = {}
        with open(summary.name) as listing:
            lines = listing.readlines()
        for line in lines:
            fields = line.split()
            # "% time  seconds  usecs/call  calls  [errors]  syscall"
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = int(fields[3])
        return counts


def per_call(first: float, second: float, n1: int, n2: int) -> float:
    return (second - first) / (n2 - n1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated operations (default: %(default)s)")
    parser.add_argument("--subjects", help="comma-separated exact subject names")
    parser.add_argument("--calls", type=int, default=2000, help="N2; N1 is half of it")
    parser.add_argument("--no-syscalls", action="store_true", help="skip the strace counts")
    parser.add_argument(
        "--calling-thread",
        action="store_true",
        help="count the calling thread's instructions only (not the disk tier's threads)",
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        location, subject, operation, calls = args.worker
        worker(location, subject, operation, int(calls))
        return
    for tool in ("valgrind", "strace"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH: apt-get install {tool}")

    from django_fastcache import compiled
    from django_fastcache.testing.servers import MemcachedServer

    operations = args.only.split(",") if args.only else list(DEFAULT_OPERATIONS)
    subjects = args.subjects.split(",") if args.subjects else list(DEFAULT_SUBJECTS)
    n2 = args.calls
    n1 = n2 // 2
    rows: list[tuple[str, str, float, dict[str, float]]] = []
    with MemcachedServer() as server:
        for subject in subjects:
            for operation in operations:
                counted = per_call(
                    instructions(server.location, subject, operation, n1, args.calling_thread),
                    instructions(server.location, subject, operation, n2, args.calling_thread),
                    n1,
                    n2,
                )
                calls: dict[str, float] = {}
                if not args.no_syscalls:
                    a = system_calls(server.location, subject, operation, n1)
                    b = system_calls(server.location, subject, operation, n2)
                    for name in set(a) | set(b):
                        count = per_call(a.get(name, 0), b.get(name, 0), n1, n2)
                        if count >= 0.05:
                            calls[name] = count
                rows.append((subject, operation, counted, calls))
                print(f"  {subject} / {operation}: {counted:,.0f}", file=sys.stderr, flush=True)
    print(
        f"FastCache {compiled.describe()}; per call, from runs of {n1} and {n2} calls"
        + ("; instructions of the calling thread only" if args.calling_thread else "")
    )
    reference = {
        "raw FastCache BlockingClient": "raw pylibmc",
        "django FastCache": "django PyLibMCCache",
        "django FastCache unsealed": "django PyLibMCCache",
    }
    found = {(s, o): n for s, o, n, _ in rows}
    print(f"{'subject':<32}{'operation':<10}{'instructions':>14}{'ratio':>8}  system calls")
    for subject, operation, counted, calls in rows:
        base = found.get((reference.get(subject, ""), operation))
        ratio = f"{counted / base:.2f}x" if base else ""
        listed = ", ".join(f"{name} {n:.1f}" for name, n in sorted(calls.items()))
        print(f"{subject:<32}{operation:<10}{counted:>14,.0f}{ratio:>8}  {listed}")


if __name__ == "__main__":
    main()
