"""What one file-tier store costs, on one thread: the time per chunk of
``fs_tier._write_chunks`` (the call a pool thread makes for its batch of
store items) writing fresh files, with no CRC-32 and with each CRC-32
function this machine has (libdeflate's, the compiled build's own by
carry-less multiplication, zlib's: called from C in the compiled build;
``zlib.crc32`` in Python otherwise). Where storage runs at
memory speed (tmpfs), the write is a page allocation and a copy, and the
CRC-32 is what a checksummed store adds to it: behind docs/DECISIONS.md
"cio2" (why stores trail vLLM's unchecked ones on tmpfs). Last, each
CRC-32's speed alone over a buffer in memory.

    python scripts/store_cost.py --dir /dev/shm --sizes 64K,256K,1M

The C path needs the file tier's C I/O: the compiled build, or
``bash scripts/build_chunkio.sh`` in a source tree (run this script from
the repository root, which it puts first on the import path).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvoffload.bench.sizes import parse_size  # noqa: E402
from kvoffload.impl import fs_tier  # noqa: E402


def crc_functions(compiled: bool) -> list[tuple[str, fs_tier._CFunction | None, bool]]:
    """(name, C function, whether to compute a CRC-32) for each choice."""
    choices: list[tuple[str, fs_tier._CFunction | None, bool]] = [("none", None, False)]
    if not compiled:
        return [*choices, ("zlib.crc32", None, True)]
    if fs_tier._FAST_CRC32 is not None:
        choices.append(("libdeflate", fs_tier._c_crc32("libdeflate"), True))
    if fs_tier._CLMUL_CRC32 is not None:
        choices.append(("pclmul", fs_tier._c_crc32("pclmul"), True))
    zlib_c = fs_tier._zlib_c_crc32()
    if zlib_c is not None:
        choices.append(("zlib", zlib_c, True))
    return choices


def one_pass(
    directory: str, view: memoryview, size: int, count: int,
    crc32: fs_tier._CFunction | None, python_crc: bool, compiled: bool, direct: bool,
) -> float:
    """Seconds per chunk to write ``count`` fresh chunk files (16 shard
    folders, made beforehand) through ``_write_chunks``."""
    root = tempfile.mkdtemp(prefix="kvoffload-store-cost-", dir=directory)
    try:
        for shard in range(16):
            os.mkdir(os.path.join(root, f"{shard:02x}"))
        folders = [os.path.join(root, f"{i % 16:02x}") for i in range(count)]
        temps = [os.path.join(folder, f"{i}.tmp") for i, folder in enumerate(folders)]
        payloads = [view[i * size : (i + 1) * size] for i in range(count)]
        started = time.perf_counter()
        prefixes = [
            os.path.join(folder, f"{i}." + (f"{zlib.crc32(payload):08x}."
                                            if python_crc else ""))
            for i, (folder, payload) in enumerate(zip(folders, payloads))
        ]
        outcomes = fs_tier._write_chunks(
            temps, prefixes, payloads, [None] * count, fs_tier.FsyncPolicy.NONE, direct,
            crc32, compiled,
        )
        elapsed = time.perf_counter() - started
        failed = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} writes failed, the first: {failed[0]}")
        return elapsed / count
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None,
                        help="where to write (default: the system's temporary directory)")
    parser.add_argument("--sizes", default="64K,256K,1M", help="chunk sizes")
    parser.add_argument("--total", default="128M", help="bytes written per pass")
    parser.add_argument("--repeats", type=int, default=3, help="passes; the median is kept")
    parser.add_argument("--python-io", action="store_true",
                        help="the Python path even where the C I/O is built")
    args = parser.parse_args(argv)
    compiled = fs_tier.COMPILED_IO and not args.python_io
    directory = args.dir or tempfile.gettempdir()
    total = parse_size(args.total)
    print(f"directory: {directory}; I/O: {'C (_chunkio)' if compiled else 'Python'}; "
          f"one thread; {args.repeats} passes of {args.total}, median; fresh files")
    print("\n| chunk | CRC-32 | µs per chunk | GB/s | CRC-32's share |")
    print("| --- | --- | ---: | ---: | ---: |")
    for size in (parse_size(text) for text in args.sizes.split(",")):
        count = max(1, total // size)
        area = mmap.mmap(-1, count * size)
        view = memoryview(area)
        view[:] = os.urandom(len(view))
        direct = size % fs_tier.DIRECT_ALIGNMENT == 0 and fs_tier._probe_direct_io(
            Path(directory))
        plain = 0.0
        for name, crc32, computes in crc_functions(compiled):
            passes = sorted(
                one_pass(directory, view, size, count, crc32, computes and crc32 is None,
                         compiled, direct)
                for _ in range(args.repeats)
            )
            seconds = passes[len(passes) // 2]
            plain = seconds if name == "none" else plain
            share = f"{(seconds - plain) / seconds:.0%}" if name != "none" else "—"
            print(f"| {size >> 10} KiB | {name} | {seconds * 1e6:.1f} | "
                  f"{size / seconds / 1e9:.2f} | {share} |")
        view.release()
        area.close()
    print("\n| CRC-32 alone (4 MiB in memory, 20 passes) | GB/s |")
    print("| --- | ---: |")
    for name, speed in crc_speeds():
        print(f"| {name} | {speed:.2f} |")
    return 0


def crc_speeds() -> list[tuple[str, float]]:
    """GB/s of each CRC-32 over one 4 MiB buffer (the same bytes each pass)."""
    data = bytearray(os.urandom(4 << 20))
    address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    functions: list[tuple[str, Callable[[], int]]] = [("zlib", lambda: zlib.crc32(data))]
    fast = fs_tier._FAST_CRC32
    if fast is not None:
        functions.insert(0, ("libdeflate", lambda: fast(0, address, len(data))))
    clmul = fs_tier._CLMUL_CRC32
    if clmul is not None:
        view = memoryview(data)
        functions.insert(-1, ("pclmul", lambda: clmul(view)))
    speeds = []
    for name, function in functions:
        expected = function()
        started = time.perf_counter()
        for _ in range(20):
            if function() != expected:
                raise RuntimeError(f"{name} gave two CRC-32s for the same bytes")
        speeds.append((name, 20 * len(data) / (time.perf_counter() - started) / 1e9))
    return speeds


if __name__ == "__main__":
    sys.exit(main())
