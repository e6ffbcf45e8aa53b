"""CPU<->GPU transfer handlers over canonical KV caches (imports torch).

:class:`CpuGpuOffloadingHandlers` allocates the CPU side (one pinned tensor
per canonical GPU tensor; plain memory where pinning is unavailable) and
builds one :class:`SingleDirectionOffloadingHandler` per direction.

On CUDA each transfer runs on a stream from a pool, after the previous
transfer of its direction (an event), and a GPU->CPU transfer also after
the work already queued on the compute stream; results come back in
submission order with times measured by CUDA events. When the KV tensors
live on the CPU the same handlers copy synchronously, so the index
arithmetic and the bytes are testable without a GPU.

Copies per transfer and tensor: each run of consecutive rows (on both sides)
of at least ``direct_copy_min_bytes`` is one ``copy_`` (a DMA on CUDA);
every other row goes in one batched gather and scatter. On CUDA the batched
rows move *zero-copy* where the driver maps the pinned CPU tier into the
GPU's address space (checked once, when the handlers are built): one kernel
gathers the source rows and one scatters them, the CPU side read or written
by the GPU over the bus, with no staging buffer and no host-side copy.
Without that mapping (or with ``zero_copy=False``) they go through pinned
staging buffers: gather on the side that owns the source rows, one DMA,
scatter on the side that owns the destination rows. No Python loop runs per
block.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, cast

import attrs
import numpy as np
import torch

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.base import (
    OffloadingHandler,
    TransferResult,
    TransferSpec,
    TransferType,
    check_job_ids,
    check_transfer,
)
from kvoffload.impl.worker.canonical import CanonicalKVCaches
from kvoffload.impl.worker.planning import (
    DEFAULT_DIRECT_COPY_MIN_BYTES,
    HOST_DIRECT_COPY_MIN_BYTES,
    ZERO_COPY_DIRECT_COPY_MIN_BYTES,
    BlockRows,
    IntArray,
    RowCopyPlan,
    map_block_rows,
    plan_row_copies,
)
from kvoffload.impl.worker.region import CpuRegion
from kvoffload.spec.errors import ConfigurationError, TransferError

logger = logging.getLogger(__name__)


# torch leaves these untyped; give them the types they have.
def _new_stream(device: torch.device) -> torch.cuda.Stream:
    make = cast(Callable[[torch.device], torch.cuda.Stream], torch.cuda.Stream)
    return make(device)


def _new_timing_event() -> torch.cuda.Event:
    make = cast(Callable[..., torch.cuda.Event], torch.cuda.Event)
    return make(enable_timing=True)


def _event_done(event: torch.cuda.Event) -> bool:
    query = cast(Callable[[], bool], event.query)
    return bool(query())



@attrs.frozen(eq=False)
class _Layout:
    """What both directions share: the tensors and their geometry."""

    gpu_tensors: tuple[torch.Tensor, ...]
    cpu_tensors: tuple[torch.Tensor, ...]
    row_bytes: tuple[int, ...]
    # Per tensor: the KV-cache groups using it, or None when all groups do.
    tensor_groups: tuple[tuple[int, ...] | None, ...]
    num_groups: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_size_factor: int
    device: torch.device
    # Route batched rows through staging buffers (always on CUDA).
    staged: bool
    # On CUDA with zero-copy: the CPU tensors as CUDA tensors (the same
    # pinned memory, mapped into the GPU's address space); else None.
    host_views: tuple[torch.Tensor, ...] | None = None
    # The CPU tensors are strided views of one chunk-major region.
    strided_cpu: bool = False

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"


class _Transfer:
    """A submitted job, from submission until its result is taken."""

    __slots__ = (
        "cpu_seconds",
        "deferred",
        "end_event",
        "job_id",
        "keepalive",
        "reported",
        "size",
        "start_event",
        "stream",
    )

    def __init__(self, job_id: int, size: int, reported: bool) -> None:
        self.job_id = job_id
        self.size = size
        self.reported = reported
        self.stream: torch.cuda.Stream | None = None
        self.start_event: torch.cuda.Event | None = None
        self.end_event: torch.cuda.Event | None = None
        self.cpu_seconds = 0.0
        # Tensors the queued copies read or write, held until they finish.
        self.keepalive: list[torch.Tensor] = []
        # Host-side work to run once the device work is done (CPU scatters).
        self.deferred: list[Callable[[], None]] = []


class SingleDirectionOffloadingHandler(OffloadingHandler):
    """Moves blocks GPU->CPU (``to_cpu``) or CPU->GPU for a
    :class:`CpuGpuOffloadingHandlers`.

    Accepts ``(GPULoadStoreSpec, CPULoadStoreSpec)`` when ``to_cpu``, else
    ``(CPULoadStoreSpec, GPULoadStoreSpec)``; see
    :func:`~kvoffload.impl.worker.planning.map_block_rows` for how the ids
    pair up and what raises :class:`TransferError`.
    """

    def __init__(self, layout: _Layout, *, to_cpu: bool, direct_copy_min_bytes: int) -> None:
        self._layout = layout
        self._to_cpu = to_cpu
        self._direct_copy_min_bytes = direct_copy_min_bytes
        self.transfer_type: TransferType = ("GPU", "CPU") if to_cpu else ("CPU", "GPU")
        self._transfers: deque[_Transfer] = deque()
        self._job_ids: set[int] = set()
        self._ready: list[TransferResult] = []
        self._last_end_event: torch.cuda.Event | None = None
        self._stream_pool: list[torch.cuda.Stream] = []
        self._event_pool: list[torch.cuda.Event] = []
        self._staging: torch.Tensor | None = None
        self._shut_down = False

    # ----------------------------------------------------------- submission

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        job_id, (src, dst) = check_transfer(job_id, spec)
        if self._shut_down:
            raise TransferError(f"job {job_id}: the handler is shut down")
        rows = self._map_rows(src, dst)
        if job_id in self._job_ids:
            raise TransferError(f"job {job_id} is already in flight")
        layout = self._layout
        src_rows, dst_rows = (
            (rows.gpu_rows, rows.cpu_rows) if self._to_cpu else (rows.cpu_rows, rows.gpu_rows)
        )
        plans = self._plan(rows, src_rows, dst_rows)
        size = sum(plan.num_rows * layout.row_bytes[idx] for idx, plan in enumerate(plans))
        if layout.on_cuda:
            accepted = self._submit_cuda(job_id, size, plans)
        elif layout.staged:
            accepted = self._submit_staged_on_host(job_id, size, plans)
        else:
            accepted = self._submit_sync(job_id, size, plans)
        if accepted:
            self._job_ids.add(job_id)
        return accepted

    def _map_rows(self, src: object, dst: object) -> BlockRows:
        layout = self._layout
        if self._to_cpu:
            gpu_spec, cpu_spec = src, dst
        else:
            cpu_spec, gpu_spec = src, dst
        if not isinstance(gpu_spec, GPULoadStoreSpec) or not isinstance(
            cpu_spec, CPULoadStoreSpec
        ):
            raise TransferError(
                f"the {self.transfer_type[0]} -> {self.transfer_type[1]} handler "
                f"takes ({self.transfer_type[0]}, {self.transfer_type[1]}) specs, "
                f"got ({type(src).__name__}, {type(dst).__name__})"
            )
        return map_block_rows(
            gpu_spec,
            cpu_spec,
            block_size_factor=layout.block_size_factor,
            num_groups=layout.num_groups,
            num_gpu_blocks=layout.num_gpu_blocks,
            num_cpu_blocks=layout.num_cpu_blocks,
            to_cpu=self._to_cpu,
        )

    def _plan(
        self, rows: BlockRows, src_rows: IntArray, dst_rows: IntArray
    ) -> list[RowCopyPlan]:
        """One plan per tensor; tensors with the same groups and row size
        share one."""
        layout = self._layout
        shared: dict[tuple[tuple[int, ...] | None, int, bool], RowCopyPlan] = {}
        plans: list[RowCopyPlan] = []
        for idx, groups in enumerate(layout.tensor_groups):
            row_bytes = layout.row_bytes[idx]
            # On CUDA a strided CPU tensor (a chunk-major region) takes no
            # direct copy: torch would stage it through pageable memory.
            runs = not (layout.on_cuda and layout.strided_cpu)
            plan = shared.get((groups, row_bytes, runs))
            if plan is None:
                if groups is None:
                    src, dst = src_rows, dst_rows
                else:
                    mask = np.isin(rows.group_of_row, np.asarray(groups, dtype=np.int64))
                    src, dst = src_rows[mask], dst_rows[mask]
                plan = plan_row_copies(
                    src, dst, row_bytes=row_bytes,
                    direct_min_bytes=self._direct_copy_min_bytes if runs else _NEVER,
                )
                shared[(groups, row_bytes, runs)] = plan
            plans.append(plan)
        return plans

    def _tensor_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        layout = self._layout
        if self._to_cpu:
            return list(zip(layout.gpu_tensors, layout.cpu_tensors))
        return list(zip(layout.cpu_tensors, layout.gpu_tensors))

    def _submit_sync(self, job_id: int, size: int, plans: list[RowCopyPlan]) -> bool:
        start = time.perf_counter()
        for (src, dst), plan in zip(self._tensor_pairs(), plans):
            _copy_runs(src, dst, plan, non_blocking=False)
            count = int(plan.gather_src.shape[0])
            if count:
                staging = self._sync_staging(count, int(src.shape[1]))
                _host_gather(src, plan.gather_src, staging)
                _host_scatter(dst, plan.gather_dst, staging)
        transfer = _Transfer(job_id, size, reported=True)
        transfer.cpu_seconds = time.perf_counter() - start
        self._transfers.append(transfer)
        return True

    def _sync_staging(self, rows: int, row_bytes: int) -> torch.Tensor:
        """A reused host buffer (fresh memory would page-fault on every
        transfer)."""
        needed = rows * row_bytes
        if self._staging is None or self._staging.numel() < needed:
            self._staging = torch.empty(needed, dtype=torch.int8)
        return self._staging[:needed].view(rows, row_bytes)

    def _submit_staged_on_host(
        self, job_id: int, size: int, plans: list[RowCopyPlan]
    ) -> bool:
        """The CUDA path's copies, synchronously on host tensors; scatters
        into the CPU tier still wait for :meth:`get_finished`."""
        start = time.perf_counter()
        transfer = _Transfer(job_id, size, reported=True)
        self._enqueue_staged(transfer, plans)
        transfer.cpu_seconds = time.perf_counter() - start
        self._transfers.append(transfer)
        return True

    def _submit_cuda(self, job_id: int, size: int, plans: list[RowCopyPlan]) -> bool:
        device = self._layout.device
        stream = self._stream_pool.pop() if self._stream_pool else _new_stream(device)
        start_event, end_event = self._take_event(), self._take_event()
        transfer = _Transfer(job_id, size, reported=True)
        transfer.stream, transfer.start_event, transfer.end_event = stream, start_event, end_event
        if self._to_cpu:
            # The blocks to offload were written by work already queued on the
            # compute stream.
            stream.wait_stream(torch.cuda.current_stream(device))
        if self._last_end_event is not None:
            stream.wait_event(self._last_end_event)
        try:
            with torch.cuda.stream(stream):
                start_event.record(stream)
                self._enqueue_staged(transfer, plans)
        except Exception:
            logger.warning("job %d failed while being queued", job_id, exc_info=True)
            transfer.reported = False
        # Even a half-queued transfer is ordered before the next one.
        end_event.record(stream)
        self._last_end_event = end_event
        self._transfers.append(transfer)
        return transfer.reported

    def _enqueue_staged(self, transfer: _Transfer, plans: list[RowCopyPlan]) -> None:
        layout = self._layout
        device, pin = layout.device, layout.on_cuda
        device_indices: dict[int, torch.Tensor] = {}
        pair_indices: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for idx, ((src, dst), plan) in enumerate(zip(self._tensor_pairs(), plans)):
            _copy_runs(src, dst, plan, non_blocking=True)
            count = int(plan.gather_src.shape[0])
            if count == 0:
                continue
            if layout.host_views is not None:
                self._enqueue_zero_copy(
                    transfer, layout.host_views[idx], layout.gpu_tensors[idx], plan,
                    pair_indices,
                )
                continue
            row_bytes = int(src.shape[1])
            # The pinned staging buffer and the device-side index stay alive
            # (in transfer.keepalive) until the transfer has finished.
            staging = torch.empty((count, row_bytes), dtype=torch.int8, pin_memory=pin)
            device_rows = plan.gather_src if self._to_cpu else plan.gather_dst
            index = device_indices.get(id(plan))
            if index is None:
                index = torch.from_numpy(device_rows).to(device, non_blocking=True)
                device_indices[id(plan)] = index
            if self._to_cpu:
                # Gather on the GPU, one DMA into pinned staging, scatter into
                # the CPU tensor once the DMA is done.
                word = _word_dtype(src)
                gathered = torch.index_select(src.view(word), 0, index)
                staging.view(word).copy_(gathered, non_blocking=True)
                transfer.keepalive += [gathered, staging, index]
                transfer.deferred.append(_scatter_later(dst, plan.gather_dst, staging))
            else:
                # Gather on the host into pinned staging, one DMA, scatter on
                # the GPU.
                _host_gather(src, plan.gather_src, staging)
                word = _word_dtype(dst)
                on_device = staging.view(word).to(device, non_blocking=True)
                dst.view(word).index_copy_(0, index, on_device)
                transfer.keepalive += [staging, on_device, index]

    def _enqueue_zero_copy(
        self,
        transfer: _Transfer,
        host: torch.Tensor,
        device_side: torch.Tensor,
        plan: RowCopyPlan,
        device_indices: dict[int, tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """One tensor's batched rows, GPU kernels only: a gather of the
        source rows and a scatter into the destination rows, one side
        (``host``) being the CPU tier's memory as the GPU maps it. Tensors
        sharing a plan share its indices."""
        layout = self._layout
        src, dst = (device_side, host) if self._to_cpu else (host, device_side)
        indices = device_indices.get(id(plan))
        if indices is None:
            both = np.concatenate((plan.gather_src, plan.gather_dst))
            on_device = torch.from_numpy(both).to(layout.device, non_blocking=True)
            count = int(plan.gather_src.shape[0])
            indices = (on_device[:count], on_device[count:])
            device_indices[id(plan)] = indices
            transfer.keepalive.append(on_device)
        src_index, dst_index = indices
        word = _word_dtype(src) if _word_dtype(src) == _word_dtype(dst) else torch.int8
        gathered = torch.index_select(src.view(word), 0, src_index)
        dst.view(word).index_copy_(0, dst_index, gathered)
        transfer.keepalive.append(gathered)

    def _take_event(self) -> torch.cuda.Event:
        if self._event_pool:
            return self._event_pool.pop()
        return _new_timing_event()

    # ------------------------------------------------------------ completion

    def get_finished(self) -> list[TransferResult]:
        results, self._ready = self._ready, []
        while self._transfers and _is_done(self._transfers[0]):
            result = self._finish(self._transfers.popleft())
            if result is not None:
                results.append(result)
        return results

    def wait(self, job_ids: Collection[int]) -> None:
        wanted = set(check_job_ids(job_ids)) & self._job_ids
        if not wanted:
            return
        last = max(pos for pos, item in enumerate(self._transfers) if item.job_id in wanted)
        end_event = self._transfers[last].end_event
        if end_event is not None:
            # Transfers of one direction run in order: the last one done
            # means all before it are.
            end_event.synchronize()
        for _ in range(last + 1):
            result = self._finish(self._transfers.popleft())
            if result is not None:
                self._ready.append(result)

    def _finish(self, transfer: _Transfer) -> TransferResult | None:
        """Complete a transfer whose device work is done (in submission
        order): run its host-side scatters, recycle its stream and events."""
        if transfer.reported:
            # A transfer that failed half-way skips its scatters: the slots
            # it was filling may already belong to a later transfer.
            for action in transfer.deferred:
                action()
        seconds = transfer.cpu_seconds
        if transfer.start_event is not None and transfer.end_event is not None:
            if transfer.reported:
                seconds = transfer.start_event.elapsed_time(transfer.end_event) * 1e-3
            self._event_pool += [transfer.start_event, transfer.end_event]
            if transfer.end_event is self._last_end_event:
                self._last_end_event = None
        if transfer.stream is not None:
            self._stream_pool.append(transfer.stream)
        transfer.keepalive.clear()
        transfer.deferred.clear()
        self._job_ids.discard(transfer.job_id)
        if not transfer.reported:
            return None
        return TransferResult(
            transfer.job_id,
            success=True,
            transfer_size=transfer.size,
            transfer_time=seconds,
            transfer_type=self.transfer_type,
        )

    def shutdown(self) -> None:
        """Wait for every job (their results stay for :meth:`get_finished`)
        and release the streams and events; later submissions raise
        :class:`TransferError`."""
        self._shut_down = True
        self.wait(list(self._job_ids))
        self._stream_pool.clear()
        self._event_pool.clear()


def _is_done(transfer: _Transfer) -> bool:
    return transfer.end_event is None or _event_done(transfer.end_event)


def _copy_runs(
    src: torch.Tensor, dst: torch.Tensor, plan: RowCopyPlan, *, non_blocking: bool
) -> None:
    for src_row, dst_row, length in zip(
        plan.run_src.tolist(), plan.run_dst.tolist(), plan.run_lengths.tolist()
    ):
        dst[dst_row : dst_row + length].copy_(
            src[src_row : src_row + length], non_blocking=non_blocking
        )


def _host_gather(src: torch.Tensor, rows: IntArray, out: torch.Tensor) -> None:
    """``out[i] = src[rows[i]]`` for host tensors (memcpy per row)."""
    torch.index_select(src, 0, torch.from_numpy(rows), out=out)


def _host_scatter(dst: torch.Tensor, rows: IntArray, values: torch.Tensor) -> None:
    """``dst[rows[i]] = values[i]`` for host tensors. numpy's row assignment
    copies whole rows; torch's CPU index_copy_ goes element by element."""
    dst.numpy()[rows] = values.numpy()


def _scatter_later(dst: torch.Tensor, rows: IntArray, values: torch.Tensor) -> Callable[[], None]:
    def scatter() -> None:
        _host_scatter(dst, rows, values)

    return scatter


_WORD_DTYPES = ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2))


def _word_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The widest integer type that tiles ``tensor``'s rows (int8 at worst),
    so that device gathers and scatters move words, not bytes. A freshly
    allocated staging buffer of the same row width accepts it too."""
    if tensor.stride(1) == 1:
        row_bytes = int(tensor.shape[1])
        for dtype, width in _WORD_DTYPES:
            if (
                row_bytes % width == 0
                and tensor.stride(0) % width == 0
                and tensor.storage_offset() % width == 0
                and tensor.data_ptr() % width == 0
            ):
                return dtype
    return torch.int8


class CpuGpuOffloadingHandlers:
    """The CPU tier for ``kv_caches`` and the two handlers that fill and
    drain it.

    Every canonical tensor gets a CPU tensor of ``num_cpu_blocks *
    block_size_factor`` rows of the same width: offloaded block ``b`` is rows
    ``b * block_size_factor`` onward (:meth:`cpu_block_view` shows it as one
    row per offloaded block). The CPU tensors are pinned when the KV caches
    are on CUDA and ``pin_memory`` holds, and plain memory otherwise.

    ``direct_copy_min_bytes`` defaults to
    :data:`~kvoffload.impl.worker.planning.ZERO_COPY_DIRECT_COPY_MIN_BYTES`
    on CUDA with zero-copy,
    :data:`~kvoffload.impl.worker.planning.DEFAULT_DIRECT_COPY_MIN_BYTES` on
    CUDA without, and :data:`~kvoffload.impl.worker.planning.HOST_DIRECT_COPY_MIN_BYTES`
    on the CPU.

    ``emulate_staging`` (KV caches on the CPU only) sends batched rows through
    the path CUDA uses — gather, staging buffer, scatter, with scatters into
    the CPU tier deferred until :meth:`get_finished` — so that path's index
    arithmetic and ordering can be tested without a GPU.

    ``zero_copy`` (CUDA only): ``None`` (the default) moves batched rows
    with GPU kernels that read and write the pinned CPU tier in place
    wherever the driver maps it into the GPU's address space, which a probe
    checks once here (a kernel writes and reads a few bytes through the
    mapping), and through staging buffers elsewhere; ``True`` insists (a
    :class:`ConfigurationError` when the probe fails or the tier is not
    pinned); ``False`` always stages. :attr:`zero_copy` says which is in
    effect.

    ``cpu_region`` (a :class:`~kvoffload.impl.worker.region.CpuRegion`)
    places the CPU tier in a caller-given buffer laid out chunk-major
    (:class:`~kvoffload.impl.worker.region.ChunkMajorLayout`): each CPU
    tensor is then a strided view ``[rows, page_size_bytes]`` of it at this
    worker's column, and a chunk's bytes over every tensor and worker are
    one contiguous row of the region, which secondary tiers read and write.
    On CUDA with ``pin_memory`` the region is pinned in place with
    ``cudaHostRegister`` (:meth:`release_region` undoes it) and mapped for
    zero-copy as a whole; where registration fails it stays pageable and
    batched rows go through staging buffers. Strided CPU tensors take no
    direct (one-DMA) run copies on CUDA: every row is batched.

    Raises :class:`ConfigurationError` for malformed ``kv_caches`` (see
    :meth:`CanonicalKVCaches.validate`), non-positive counts, or a
    ``cpu_region`` too small or laid out for other tensors or chunk size.
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        block_size_factor: int,
        num_cpu_blocks: int,
        *,
        pin_memory: bool = True,
        direct_copy_min_bytes: int | None = None,
        emulate_staging: bool = False,
        zero_copy: bool | None = None,
        cpu_region: CpuRegion | None = None,
    ) -> None:
        for name, value in (
            ("block_size_factor", block_size_factor),
            ("num_cpu_blocks", num_cpu_blocks),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        if direct_copy_min_bytes is not None and direct_copy_min_bytes < 0:
            raise ConfigurationError(
                f"direct_copy_min_bytes must be >= 0, got {direct_copy_min_bytes}"
            )
        if zero_copy is not None and not isinstance(zero_copy, bool):
            raise ConfigurationError(f"zero_copy must be None or a bool, got {zero_copy!r}")
        num_gpu_blocks = kv_caches.validate()
        self.kv_caches = kv_caches
        device = kv_caches.tensors[0].tensor.device
        if device.type not in ("cuda", "cpu"):
            raise ConfigurationError(f"KV caches on {device} are not supported")
        pin = pin_memory and device.type == "cuda"
        self.cpu_region = cpu_region
        self._registered: int | None = None  # cudaHostRegister'ed address
        region_rows: torch.Tensor | None = None
        if cpu_region is None:
            cpu_tensors, self.pinned = _allocate_cpu_tensors(
                [item.page_size_bytes for item in kv_caches.tensors],
                num_cpu_blocks * block_size_factor,
                pin,
            )
        else:
            region_rows, cpu_tensors = _region_tensors(
                cpu_region, kv_caches, block_size_factor, num_cpu_blocks
            )
            self._registered = _host_register(region_rows) if pin else None
            self.pinned = self._registered is not None
        host_views = None
        if device.type == "cuda" and zero_copy is not False:
            if not self.pinned:
                host_views = None
            elif region_rows is None:
                host_views = _map_into_device(cpu_tensors, device)
            else:
                host_views = _map_region_into_device(region_rows, cpu_tensors, device)
            if host_views is None and zero_copy:
                raise ConfigurationError(
                    "zero_copy=True, but the CPU tier is not pinned or this "
                    "driver does not map pinned memory into the GPU's address space"
                )
        elif zero_copy and device.type != "cuda":
            raise ConfigurationError("zero_copy=True needs KV caches on CUDA")
        self.zero_copy = host_views is not None
        all_groups = tuple(range(kv_caches.num_groups))
        tensor_groups: list[tuple[int, ...] | None] = []
        for idx in range(len(kv_caches.tensors)):
            groups = tuple(
                group
                for group in all_groups
                if idx in kv_caches.tensors_of_group(group)
            )
            tensor_groups.append(None if groups == all_groups else groups)
        self._layout = _Layout(
            gpu_tensors=tuple(item.tensor for item in kv_caches.tensors),
            cpu_tensors=tuple(cpu_tensors),
            row_bytes=tuple(item.page_size_bytes for item in kv_caches.tensors),
            tensor_groups=tuple(tensor_groups),
            num_groups=kv_caches.num_groups,
            num_gpu_blocks=num_gpu_blocks,
            num_cpu_blocks=num_cpu_blocks,
            block_size_factor=block_size_factor,
            device=device,
            staged=device.type == "cuda" or emulate_staging,
            host_views=host_views,
            strided_cpu=cpu_region is not None,
        )
        self.block_size_factor = block_size_factor
        self.num_cpu_blocks = num_cpu_blocks
        self.num_gpu_blocks = num_gpu_blocks
        if direct_copy_min_bytes is None:
            if self.zero_copy:
                direct_copy_min_bytes = ZERO_COPY_DIRECT_COPY_MIN_BYTES
            elif self._layout.staged:
                direct_copy_min_bytes = DEFAULT_DIRECT_COPY_MIN_BYTES
            else:
                direct_copy_min_bytes = HOST_DIRECT_COPY_MIN_BYTES
        self.direct_copy_min_bytes = direct_copy_min_bytes
        self.gpu_to_cpu_handler = SingleDirectionOffloadingHandler(
            self._layout, to_cpu=True, direct_copy_min_bytes=direct_copy_min_bytes
        )
        self.cpu_to_gpu_handler = SingleDirectionOffloadingHandler(
            self._layout, to_cpu=False, direct_copy_min_bytes=direct_copy_min_bytes
        )

    @property
    def cpu_tensors(self) -> tuple[torch.Tensor, ...]:
        """The CPU tensors, one per canonical tensor, with GPU-block-sized
        rows (strided views of the region with ``cpu_region``)."""
        return self._layout.cpu_tensors

    def cpu_block_view(self, tensor_idx: int) -> torch.Tensor:
        """CPU tensor ``tensor_idx`` with one row per offloaded block.
        Raises :class:`ConfigurationError` with ``cpu_region`` (a tensor's
        block is not contiguous there; the region's chunk rows are)."""
        tensor = self._layout.cpu_tensors[tensor_idx]
        if self.cpu_region is not None:
            raise ConfigurationError(
                "a chunk-major CPU tier has no per-tensor block view; read the "
                "region's chunk rows instead"
            )
        return tensor.view(self.num_cpu_blocks, -1)

    def release_region(self) -> None:
        """Undo the CUDA registration of ``cpu_region`` (if any); call it
        once every transfer has finished and before the region is unmapped.
        Idempotent."""
        if self._registered is not None:
            _host_unregister(self._registered)
            self._registered = None

    @property
    def cpu_bytes(self) -> int:
        """Bytes of CPU memory held by the CPU tensors."""
        return sum(t.numel() for t in self._layout.cpu_tensors)


def _allocate_cpu_tensors(
    row_bytes: list[int], num_rows: int, pin: bool
) -> tuple[list[torch.Tensor], bool]:
    if pin:
        try:
            return (
                [torch.empty((num_rows, width), dtype=torch.int8, pin_memory=True)
                 for width in row_bytes],
                True,
            )
        except RuntimeError:
            logger.warning("pinned memory unavailable; using pageable CPU memory",
                           exc_info=True)
    return [torch.empty((num_rows, width), dtype=torch.int8) for width in row_bytes], False


_NEVER = 1 << 62
"""A ``direct_copy_min_bytes`` no run reaches."""


def _region_tensors(
    region: CpuRegion, kv_caches: CanonicalKVCaches, factor: int, num_cpu_blocks: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The region's rows as one ``[rows, row_stride]`` int8 tensor, and
    each canonical tensor's CPU side as a strided ``[rows, w_i]`` view of
    it at the worker's column (:class:`~kvoffload.impl.worker.region.
    ChunkMajorLayout`)."""
    layout = region.layout
    widths = tuple(item.page_size_bytes for item in kv_caches.tensors)
    if widths != layout.tensor_row_bytes or factor != layout.block_size_factor:
        raise ConfigurationError(
            f"the region's layout is for tensors of {layout.tensor_row_bytes} bytes per "
            f"block and {layout.block_size_factor} blocks per chunk; these KV caches "
            f"have {widths} and the tier {factor}"
        )
    num_rows = num_cpu_blocks * factor
    needed = num_rows * layout.row_stride
    try:
        base = torch.frombuffer(cast(bytearray, region.buffer), dtype=torch.int8)
    except (TypeError, ValueError) as error:
        raise ConfigurationError(f"cpu_region's buffer is not a writable buffer: {error}") from None
    if base.numel() < needed:
        raise ConfigurationError(
            f"cpu_region holds {base.numel()} bytes; {num_cpu_blocks} chunks of "
            f"{layout.chunk_bytes} bytes need {needed}"
        )
    rows = base[:needed].view(num_rows, layout.row_stride)
    tensors = [
        rows[:, offset : offset + width]
        for offset, width in zip(layout.column_offsets(region.rank), widths)
    ]
    return rows, tensors


def _cudart() -> Any:
    """torch's binding of the CUDA runtime (untyped in torch)."""
    get: Callable[[], Any] = torch.cuda.cudart
    return get()


def _host_register(rows: torch.Tensor) -> int | None:
    """Pin ``rows``' memory for the GPU's DMA engines with
    ``cudaHostRegister`` (portable, mapped); the address registered, or
    None where the runtime refuses (the tier then stays pageable: batched
    rows go through pinned staging buffers, correct but slower)."""
    if rows.numel() == 0:
        return None
    try:
        cudart = _cudart()
        # cudaHostRegisterPortable | cudaHostRegisterMapped
        code = cudart.cudaHostRegister(rows.data_ptr(), rows.numel(), 0x1 | 0x2)
    except (RuntimeError, AttributeError, TypeError):
        logger.warning("cudaHostRegister unavailable; the CPU tier stays pageable",
                       exc_info=True)
        return None
    if int(getattr(code, "value", code)) != 0:
        logger.warning("cudaHostRegister failed (%s); the CPU tier stays pageable", code)
        return None
    return int(rows.data_ptr())


def _host_unregister(address: int) -> None:
    try:
        code = _cudart().cudaHostUnregister(address)
    except (RuntimeError, AttributeError, TypeError):
        logger.warning("cudaHostUnregister failed", exc_info=True)
        return
    if int(getattr(code, "value", code)) != 0:
        logger.warning("cudaHostUnregister failed (%s)", code)


def _map_region_into_device(
    rows: torch.Tensor, cpu_tensors: list[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, ...] | None:
    """The region (registered, contiguous) mapped into the GPU as a whole
    (probed as :func:`_map_into_device` probes), then each CPU tensor as
    the same columns of that CUDA view: strided CUDA tensors over the
    CPU tier's memory. None where the mapping fails."""
    mapped = _map_into_device([rows], device)
    if mapped is None:
        return None
    (device_rows,) = mapped
    base = rows.data_ptr()
    views = []
    for tensor in cpu_tensors:
        offset = tensor.data_ptr() - base
        views.append(device_rows[:, offset : offset + int(tensor.shape[1])])
    return tuple(views)


class _PinnedRows:
    """A pinned CPU tensor's memory described through the CUDA array
    interface, so that torch wraps it as a CUDA tensor (torch accepts host
    memory the driver has registered). Holds the tensor: the view keeps
    this object, and so the memory, alive."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape),
            "typestr": "|i1",
            "data": (tensor.data_ptr(), False),
            "strides": None,
            "version": 2,
        }


def _map_into_device(
    cpu_tensors: list[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, ...] | None:
    """``cpu_tensors`` (pinned, int8, contiguous) as CUDA tensors over the
    same memory, or None where that fails: a kernel must write bytes the
    host then reads, and read bytes the host wrote."""
    try:
        views = tuple(
            torch.as_tensor(_PinnedRows(tensor), device=device) for tensor in cpu_tensors
        )
        for tensor, view in zip(cpu_tensors, views):
            if view.data_ptr() != tensor.data_ptr() or view.shape != tensor.shape:
                return None
            if tensor.numel() == 0:
                continue
            probe = tensor.view(-1)[:64]
            view_probe = view.view(-1)[: probe.numel()]
            view_probe.fill_(0x5A)  # a kernel writes host memory
            torch.cuda.synchronize(device)
            if not bool((probe == 0x5A).all()):
                return None
            probe.fill_(0x21)  # the host writes; a kernel reads
            if int(view_probe.to(torch.int32).sum().item()) != 0x21 * probe.numel():
                return None
            probe.zero_()
        return views
    except (RuntimeError, TypeError, ValueError):
        logger.warning("pinned CPU memory cannot be mapped into %s; staging instead",
                       device, exc_info=True)
        return None
