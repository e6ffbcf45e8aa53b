"""The garbage collector's pauses during a ``python -m kvoffload`` command:
each collection that takes at least ``--min-ms``, its generation and the
thread it ran on, then the objects the collector tracks once the command
is done and how long one full collection over them takes. Behind
docs/DECISIONS.md "h200" (the ~0.1 s maximum of ``submit_*`` in
``bench tier`` runs before its heap was frozen).

    python scripts/gc_pauses.py -- bench tier --vllm-path /tmp/vllm/0.33.0 --sizes 256K,1M,4M --no-gc-freeze
    python scripts/gc_pauses.py -- bench tier --vllm-path /tmp/vllm/0.33.0 --sizes 256K,1M,4M
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvoffload.__main__ import main as kvoffload_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-ms", type=float, default=5.0,
                        help="report collections at least this long (default: 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the kvoffload command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a kvoffload command after --")
    started: dict[int, float] = {}
    pauses: list[tuple[float, int, str]] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        me = threading.get_ident()
        if phase == "start":
            started[me] = time.perf_counter()
            return
        seconds = time.perf_counter() - started.pop(me, time.perf_counter())
        if seconds * 1e3 >= args.min_ms:
            pauses.append((seconds, info["generation"], threading.current_thread().name))

    gc.callbacks.append(timed)
    try:
        status = kvoffload_main(command)
    finally:
        gc.callbacks.remove(timed)
    print(f"collections of at least {args.min_ms:g} ms during the command:")
    for seconds, generation, thread in pauses:
        print(f"  generation {generation}: {seconds * 1e3:.1f} ms on {thread}")
    tracked = len(gc.get_objects())
    start = time.perf_counter()
    gc.collect()
    print(
        f"afterwards: {tracked} tracked objects, one full collection "
        f"{(time.perf_counter() - start) * 1e3:.1f} ms"
    )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
