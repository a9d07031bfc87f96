"""Cache lines per call with the CPU's caches cold: what a call costs under eight processes.

    python bench/cold_lines_per_call.py [--only get,set] [--subjects "django FastCache,..."]
        [--calls 400] [--top 0]

Under cachebench's eight processes on two vCPUs every call starts with the CPU's caches
holding the other processes' lines, and a call then costs about what it reaches of memory:
each line of code or data it touches. Paced as a cachebench worker is
(``bench/tier_excess.py``), a tiered set takes about 16 µs of CPU more than an untiered one,
against under 1 µs in a tight loop; timed, that moves by a third from run to run on a
shared VM. This counts it instead.

Each case runs under valgrind's callgrind with its cache simulation, twice (N/2 and N
calls), and before every call a pass over twice the last-level cache's size evicts it; the
first-level caches are simulated tiny (1 KiB), so that a line touched by a call misses the
last level unless the call itself touched it before. Per call, then, the last-level misses
(instruction and data reads, data writes) are the distinct lines of code and data the call
touches: its cold footprint. The eviction's own misses are the same before every call and
are taken out (a case calling nothing). Counted in the thread making the calls only.

What the count leaves out: the kernel (valgrind sees user space only; a system call's own
lines are every client's), and the real caches' sizes and ways. FastCache's rows also make
one zero-timeout ``poll`` per call here, which cachebench's pace seldom makes (a
connection idle for 2 ms is polled before its next request; under valgrind every call
is): about 20 lines against them.

``--top N``: also the N functions with the most cold lines per call in each case, to see
where a footprint goes; ``--keep DIR`` keeps callgrind's outputs.

Subjects and operations are ``bench/instructions_per_call.py``'s. Needs valgrind on PATH.
"""

from __future__ import annotations

import argparse
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
import instructions_per_call

#: The first subject of each operation that others are compared with, when it is run.
REFERENCE = "django PyLibMCCache"
DEFAULT_SUBJECTS = (REFERENCE, "django FastCache", "django FastCache tiered")
DEFAULT_OPERATIONS = ("get", "set", "delete")
#: The simulated last level (1 MiB, 16-way: about an L2 of the machines measured) and the
#: first levels, tiny so that a call's every new line reaches the last level.
LAST_LEVEL = 1 << 20
CACHES = ("--I1=1024,2,64", "--D1=1024,2,64", f"--LL={LAST_LEVEL},16,64")
EVENTS = ("ILmr", "DLmr", "DLmw")
NOTHING = "nothing"


def _evicting(call: Callable[[], object]) -> Callable[[], None]:
    """``call`` after a pass over twice the last level's size (every 64th byte read)."""
    sweep = bytearray(2 * LAST_LEVEL)

    def paced() -> None:
        sweep[::64]  # (read for its effect on the caches)
        call()

    return paced


def worker(location: str, subject: str, operation: str, calls: int) -> None:
    directory = tempfile.mkdtemp(prefix="fastcache-cold-")
    try:
        cpu_per_call.configure_django(location, directory, None)
        if subject == NOTHING:
            call: Callable[[], object] = lambda: None  # noqa: E731
        else:
            call = instructions_per_call._calls(location, subject)[operation]
        for _ in range(instructions_per_call.WARM_UP):
            call()
        instructions_per_call._settle(subject)
        paced = _evicting(call)
        for _ in range(calls):
            paced()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run(location: str, subject: str, operation: str, calls: int, out: str) -> dict[str, int]:
    """Cold lines (the EVENTS, summed over the calling thread) of one run."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--cache-sim=yes",
        *CACHES,
        "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        *instructions_per_call._worker_command(location, subject, operation, calls, __file__),
    ]
    # One hash seed: the lines a dict lookup touches depend on where its keys hash to.
    environment = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind failed for {subject} / {operation}:\n{done.stderr}")
    with open(out + "-01") as main_thread:
        events: list[str] = []
        for line in main_thread:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("summary:"):
                totals = dict(zip(events, map(int, line.split()[1:]), strict=False))
                return {name: totals.get(name, 0) for name in EVENTS}
    raise RuntimeError(f"no summary in callgrind's output for {subject} / {operation}")


def _by_function(out: str) -> dict[str, int]:
    """Cold lines (the EVENTS summed) by function, in the calling thread of a run."""
    listing = subprocess.run(
        [
            "callgrind_annotate",
            "--inclusive=no",
            f"--show={','.join(EVENTS)}",
            "--threshold=100",
            "--show-percs=no",
            out + "-01",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[str, int] = {}
    for line in listing.splitlines():
        matched = re.match(r"\s*((?:[\d,.]+(?: \([ \d.]+%\))?\s+){3})(\S.*)$", line)
        if matched is None:
            continue
        counts = re.findall(r"([\d,]+|\.)(?: \([ \d.]+%\))?\s+", matched.group(1))
        # (callgrind_annotate names a function once per call count: "f (1,509x)".)
        name = re.sub(r" \[.*\]$", "", matched.group(2)).rsplit(":", 1)[-1]
        name = re.sub(r" \([\d,]+x\)$", "", name)
        if name.startswith("PROGRAM TOTALS") or name.endswith("events annotated"):
            continue
        found[name] = found.get(name, 0) + sum(
            0 if count == "." else int(count.replace(",", "")) for count in counts
        )
    return found


def _per_call(path_a: str, path_b: str, calls: int) -> dict[str, float]:
    """Cold lines per call by function: the second run's less the first's."""
    a, b = _by_function(path_a), _by_function(path_b)
    return {name: (b[name] - a.get(name, 0)) / calls for name in b}


def _top(case: dict[str, float], baseline: dict[str, float], count: int) -> list[str]:
    """The ``count`` functions with the most cold lines per call in ``case``, the eviction's
    own (``baseline``: the case calling nothing) taken out."""
    own = {name: lines - baseline.get(name, 0.0) for name, lines in case.items()}
    ranked = sorted(own.items(), key=lambda item: -item[1])[:count]
    return [f"{lines:7.1f}  {name}" for name, lines in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated operations")
    parser.add_argument("--subjects", help="comma-separated exact subject names")
    parser.add_argument("--calls", type=int, default=400, help="N; the first run makes N/2")
    parser.add_argument("--top", type=int, default=0, help="functions shown per case")
    parser.add_argument("--keep", help="a directory to keep callgrind's outputs in")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        location, subject, operation, calls = args.worker
        worker(location, subject, operation, int(calls))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: apt-get install valgrind")
    subjects = args.subjects.split(",") if args.subjects else list(DEFAULT_SUBJECTS)
    operations = args.only.split(",") if args.only else list(DEFAULT_OPERATIONS)
    first, second = args.calls // 2, args.calls
    from django_fastcache import compiled
    from django_fastcache.testing.servers import MemcachedServer

    with MemcachedServer() as server, tempfile.TemporaryDirectory() as scratch:
        location = server.location
        out = args.keep or scratch
        os.makedirs(out, exist_ok=True)

        def per_call(subject: str, operation: str) -> tuple[dict[str, float], str, str]:
            name = f"{subject.replace(' ', '_')}-{operation}"
            path_a, path_b = os.path.join(out, f"{name}-a"), os.path.join(out, f"{name}-b")
            a = _run(location, subject, operation, first, path_a)
            b = _run(location, subject, operation, second, path_b)
            lines = {name: (b[name] - a[name]) / (second - first) for name in EVENTS}
            return lines, path_a, path_b

        baseline, base_a, base_b = per_call(NOTHING, "get")
        base_functions = _per_call(base_a, base_b, second - first) if args.top else {}
        print(
            f"FastCache {compiled.describe()}; cold lines per call, "
            f"from runs of {first} and {second} calls"
        )
        print(
            f"{'operation':<10}{'subject':<28}{'code':>8}{'read':>8}{'written':>8}"
            f"{'total':>8}  ratio"
        )
        for operation in operations:
            reference: float | None = None
            for subject in subjects:
                lines, path_a, path_b = per_call(subject, operation)
                own = {name: lines[name] - baseline[name] for name in EVENTS}
                total = sum(own.values())
                if subject == REFERENCE:
                    reference = total
                ratio = "" if reference is None else f"{total / reference:.2f}x {REFERENCE}"
                print(
                    f"{operation:<10}{subject:<28}"
                    + "".join(f"{own[name]:8.1f}" for name in EVENTS)
                    + f"{total:8.1f}  {ratio}",
                    flush=True,
                )
                if args.top:
                    functions = _per_call(path_a, path_b, second - first)
                    for row in _top(functions, base_functions, args.top):
                        print("    " + row)


if __name__ == "__main__":
    main()
