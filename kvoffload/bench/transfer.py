"""``python -m kvoffload bench transfer``: throughput of the CPU<->GPU
handlers against a bulk copy (the ceiling) and a naive per-block loop.

For each block size, direction (GPU->CPU, CPU->GPU) and id layout
(contiguous, scattered) it moves the same number of bytes three ways:

- handler: ``CpuGpuOffloadingHandlers`` with one canonical tensor whose
  rows are the block size (``block_size_factor`` 1), timed from
  ``transfer_async`` to the end of ``wait`` (planning included);
- ceiling: one copy between a contiguous pinned CPU buffer and a contiguous
  device buffer of the same bytes;
- naive: a Python loop of one ``copy_`` per block over the same ids.

Without CUDA the "GPU" tensors live in host memory: the figures then measure
host memcpy paths, not PCIe, and the output says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from kvoffload.bench.sizes import format_size, parse_size
from kvoffload.usage import UsageError, int_in, writable_file

if TYPE_CHECKING:
    import torch

DEFAULT_SIZES = ("16K", "64K", "256K", "2M")


@attrs.frozen
class TransferFigure:
    """One measured case; throughputs in GB/s (10**9 bytes per second)."""

    block_bytes: int
    layout: str  # "contiguous" or "scattered"
    direction: str  # "GPU->CPU" or "CPU->GPU"
    num_blocks: int
    handler_gbps: float
    ceiling_gbps: float
    naive_gbps: float

    @property
    def of_ceiling(self) -> float:
        return self.handler_gbps / self.ceiling_gbps

    @property
    def over_naive(self) -> float:
        return self.handler_gbps / self.naive_gbps


def _median_seconds(action: Callable[[], None], sync: Callable[[], None],
                    repeats: int) -> float:
    action()  # warm-up: page faults, allocator, CUDA context
    sync()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        action()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(
    block_sizes: Sequence[int],
    *,
    total_bytes: int,
    repeats: int = 5,
    device: str = "auto",
    seed: int = 0,
    direct_copy_min_bytes: int | None = None,
    zero_copy: bool | None = None,
) -> tuple[str, list[TransferFigure]]:
    """Run every case; returns a description of the device and the figures."""
    import torch

    from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
    from kvoffload.impl.worker.canonical import CanonicalKVCaches
    from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    on_cuda = dev.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if on_cuda else (lambda: None)
    rng = np.random.default_rng(seed)
    figures: list[TransferFigure] = []
    job_ids = iter(range(1 << 62))
    pinned = mapped = False
    for block_bytes in block_sizes:
        count = max(8, total_bytes // block_bytes)
        pool = 2 * count
        gpu = torch.zeros((pool, block_bytes), dtype=torch.int8, device=dev)
        handlers = CpuGpuOffloadingHandlers(
            CanonicalKVCaches.single_group([gpu]), 1, pool,
            direct_copy_min_bytes=direct_copy_min_bytes, zero_copy=zero_copy,
        )
        pinned, mapped = handlers.pinned, handlers.zero_copy
        cpu = handlers.cpu_tensors[0]
        cpu.zero_()
        host_bulk = torch.zeros((count, block_bytes), dtype=torch.int8,
                                pin_memory=handlers.pinned)
        device_bulk = torch.zeros((count, block_bytes), dtype=torch.int8, device=dev)
        layouts = {
            "contiguous": (np.arange(count), np.arange(count)),
            "scattered": (np.sort(rng.permutation(pool)[:count]),
                          rng.permutation(pool)[:count]),
        }
        for layout, (gpu_ids, cpu_ids) in layouts.items():
            for direction in ("GPU->CPU", "CPU->GPU"):
                to_cpu = direction == "GPU->CPU"
                handler = handlers.gpu_to_cpu_handler if to_cpu else handlers.cpu_to_gpu_handler
                gpu_spec, cpu_spec = GPULoadStoreSpec(gpu_ids), CPULoadStoreSpec(cpu_ids)
                spec = (gpu_spec, cpu_spec) if to_cpu else (cpu_spec, gpu_spec)

                def run_handler() -> None:
                    job = next(job_ids)
                    handler.transfer_async(job, spec)
                    handler.wait([job])
                    handler.get_finished()

                def run_ceiling() -> None:
                    if to_cpu:
                        host_bulk.copy_(device_bulk, non_blocking=True)  # noqa: F821 (bound each iteration; deleted after use)
                    else:
                        device_bulk.copy_(host_bulk, non_blocking=True)  # noqa: F821

                src_t, dst_t = (gpu, cpu) if to_cpu else (cpu, gpu)
                pairs = list(zip(gpu_ids.tolist(), cpu_ids.tolist()))
                if not to_cpu:
                    pairs = [(c, g) for g, c in pairs]

                def run_naive() -> None:
                    for src_row, dst_row in pairs:
                        dst_t[dst_row].copy_(src_t[src_row], non_blocking=True)

                moved = count * block_bytes
                figures.append(TransferFigure(
                    block_bytes=block_bytes,
                    layout=layout,
                    direction=direction,
                    num_blocks=count,
                    handler_gbps=moved / _median_seconds(run_handler, sync, repeats) / 1e9,
                    ceiling_gbps=moved / _median_seconds(run_ceiling, sync, repeats) / 1e9,
                    naive_gbps=moved / _median_seconds(run_naive, sync, repeats) / 1e9,
                ))
        handlers.gpu_to_cpu_handler.shutdown()
        handlers.cpu_to_gpu_handler.shutdown()
        del gpu, handlers, cpu, host_bulk, device_bulk
    return _describe(dev, pinned=pinned, zero_copy=mapped), figures


def _describe(dev: torch.device, *, pinned: bool, zero_copy: bool = False) -> str:
    import torch

    threads = torch.get_num_threads()
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        return (f"CUDA {name} (torch {torch.__version__}); CPU side pinned: "
                f"{pinned}; batched rows: {'zero-copy' if zero_copy else 'staged'}")
    return (
        f"CPU only ({platform.machine()}, {threads} torch threads, torch "
        f"{torch.__version__}): no CUDA device, so both sides are host memory "
        "and these figures measure host memcpy paths, not PCIe transfers"
    )


def render(description: str, figures: Sequence[TransferFigure]) -> str:
    lines = [
        f"device: {description}",
        "",
        "| block | ids | direction | blocks | handler GB/s | ceiling GB/s | "
        "% of ceiling | naive GB/s | x naive |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for fig in figures:
        lines.append(
            f"| {format_size(fig.block_bytes)} | {fig.layout} | {fig.direction} | "
            f"{fig.num_blocks} | {fig.handler_gbps:.2f} | {fig.ceiling_gbps:.2f} | "
            f"{100 * fig.of_ceiling:.0f}% | {fig.naive_gbps:.2f} | "
            f"{fig.over_naive:.1f} |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default=",".join(DEFAULT_SIZES),
        help="comma-separated block sizes (default: %(default)s)",
    )
    parser.add_argument(
        "--total", default=None,
        help="bytes per transfer, e.g. 256M (default: 256M on CUDA, 64M on CPU)",
    )
    parser.add_argument("--repeats", type=int_in(1), default=5,
                        help="timed runs per case; the median is kept")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--direct-copy-min-bytes", type=int_in(0), default=None,
        help="handler tuning: runs at least this long get one copy each",
    )
    parser.add_argument(
        "--threads", type=int_in(1, 1024), default=None,
        help="torch CPU threads (default: 1 without CUDA, where thread "
        "wake-ups otherwise dominate small copies; unchanged with CUDA)",
    )
    parser.add_argument(
        "--zero-copy", choices=("auto", "on", "off"), default="auto",
        help="handler tuning on CUDA: batched rows by GPU kernels over the "
        "mapped CPU tier (on), through staging buffers (off), or zero-copy "
        "where the driver maps pinned memory (auto)",
    )
    parser.add_argument("--json", type=writable_file, default=None, metavar="PATH",
                        help="also write the figures as JSON to PATH")


TORCH_ADVICE = (
    "bench transfer needs torch (the worker-side extra).\n"
    "  On a GPU machine, the CUDA build (what the worker side is for):\n"
    "    pip install torch==2.13.0\n"
    "  Without a GPU, PyTorch's CPU build from its CPU wheel index (from the public\n"
    "  index, torch==2.13.0 is the CUDA build, gigabytes of CUDA packages):\n"
    "    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
)


MAX_TOTAL = 16 << 30
"""Largest --total: the run holds about twice this in memory (source and
destination tensors)."""


def _size_arg(text: str, name: str) -> int:
    try:
        value = parse_size(text)
    except (ValueError, OverflowError):
        raise UsageError(f"{name}: not a size: {text!r} (e.g. 16K, 2M, 256M)") from None
    if value < 1:
        raise UsageError(f"{name}: must be at least 1 byte, got {text!r}")
    return value


def check_arguments(args: argparse.Namespace) -> tuple[list[int], int | None]:
    """The block sizes and the total (None: the device's default), checked
    before any work; :class:`UsageError` for a bad value."""
    sizes = [_size_arg(item, "--sizes") for item in args.sizes.split(",") if item.strip()]
    if not sizes:
        raise UsageError("--sizes: no block size given")
    total = _size_arg(args.total, "--total") if args.total else None
    if total is not None:
        if total > MAX_TOTAL:
            raise UsageError(f"--total: at most {format_size(MAX_TOTAL)}, got {args.total!r}")
        memory = _physical_memory()
        if memory is not None and 2 * total > memory // 2:
            raise UsageError(
                f"--total {args.total} needs about {format_size(2 * total)} of memory; "
                f"this machine has {format_size(memory)}"
            )
    smallest_total = total if total is not None else 64 << 20
    too_big = [size for size in sizes if size > smallest_total]
    if too_big:
        raise UsageError(f"--sizes: a block of {too_big[0]} bytes exceeds the total")
    return sizes, total


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    try:
        import torch
    except ImportError:
        print(TORCH_ADVICE, file=sys.stderr)
        return 2
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device available")
        return 2
    threads = args.threads if args.threads is not None else (
        None if device == "cuda" else 1
    )
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(args, device)
    finally:
        torch.set_num_threads(previous_threads)


def _run(args: argparse.Namespace, device: str) -> int:
    sizes, given_total = check_arguments(args)
    total = given_total if given_total is not None else (
        256 << 20 if device == "cuda" else 64 << 20
    )
    description, figures = measure(
        sizes, total_bytes=total, repeats=args.repeats, device=device,
        seed=args.seed, direct_copy_min_bytes=args.direct_copy_min_bytes,
        zero_copy={"auto": None, "on": True, "off": False}[args.zero_copy],
    )
    print(render(description, figures))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"device": description, "total_bytes": total,
                 "figures": [attrs.asdict(fig) for fig in figures]},
                handle, indent=2,
            )
    return 0
