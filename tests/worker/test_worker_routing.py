"""OffloadingWorker routes by media and turns failures into failed results;
CPUOffloadingSpec wires a manager and handlers from one configuration."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Collection

import pytest

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.base import OffloadingHandler, TransferResult, TransferSpec
from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.errors import ConfigurationError, TransferError


class RecordingHandler(OffloadingHandler):
    """Finishes each accepted job on the next get_finished; can be told to
    raise or refuse."""

    def __init__(self, *, raise_on_submit: bool = False, refuse: bool = False,
                 raise_on_finish: bool = False) -> None:
        self.raise_on_submit = raise_on_submit
        self.refuse = refuse
        self.raise_on_finish = raise_on_finish
        self.pending: list[int] = []
        self.waited: list[int] = []

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        if self.raise_on_submit:
            raise RuntimeError("device fell over")
        if self.refuse:
            return False
        self.pending.append(job_id)
        return True

    def get_finished(self) -> list[TransferResult]:
        if self.raise_on_finish:
            raise RuntimeError("lost the device")
        done, self.pending = self.pending, []
        return [TransferResult(job, True, 1, 0.0, ("GPU", "CPU")) for job in done]

    def wait(self, job_ids: Collection[int]) -> None:
        self.waited += list(job_ids)


STORE = (GPULoadStoreSpec([0]), CPULoadStoreSpec([0]))
LOAD = (CPULoadStoreSpec([0]), GPULoadStoreSpec([0]))


def _worker(store: OffloadingHandler, load: OffloadingHandler | None = None) -> OffloadingWorker:
    worker = OffloadingWorker()
    worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, store)
    if load is not None:
        worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, load)
    return worker


def test_routes_by_media() -> None:
    store, load = RecordingHandler(), RecordingHandler()
    worker = _worker(store, load)
    assert worker.transfer_types == (("GPU", "CPU"), ("CPU", "GPU"))
    assert worker.transfer_async(1, STORE)
    assert worker.transfer_async(2, LOAD)
    assert (store.pending, load.pending) == ([1], [2])
    worker.wait([1, 2, 3])
    assert (store.waited, load.waited) == ([1], [2])
    assert sorted(r.job_id for r in worker.get_finished()) == [1, 2]
    assert worker.get_finished() == []


def test_unknown_media_pair_is_a_failed_result() -> None:
    worker = _worker(RecordingHandler())
    assert not worker.transfer_async(4, LOAD)
    assert worker.get_finished() == [
        TransferResult(4, False, 0, None, ("CPU", "GPU"))
    ]


@pytest.mark.parametrize("handler", [
    RecordingHandler(raise_on_submit=True), RecordingHandler(refuse=True)
], ids=["raises", "refuses"])
def test_a_handler_that_raises_or_refuses_gives_a_failed_result(handler: RecordingHandler) -> None:
    worker = _worker(handler)
    assert not worker.transfer_async(9, STORE)
    [result] = worker.get_finished()
    assert (result.job_id, result.success, result.transfer_type) == (9, False, ("GPU", "CPU"))
    # the failed id is free again
    handler.raise_on_submit = handler.refuse = False
    assert worker.transfer_async(9, STORE)


def test_a_handler_that_fails_while_reporting_fails_its_jobs_only() -> None:
    broken, healthy = RecordingHandler(), RecordingHandler()
    worker = _worker(broken, healthy)
    assert worker.transfer_async(1, STORE)
    assert worker.transfer_async(2, LOAD)
    broken.raise_on_finish = True
    results = {r.job_id: r.success for r in worker.get_finished()}
    assert results == {1: False, 2: True}
    assert worker.get_finished() == []


def test_a_job_in_flight_cannot_be_resubmitted() -> None:
    worker = _worker(RecordingHandler())
    assert worker.transfer_async(1, STORE)
    with pytest.raises(TransferError, match="already in flight"):
        worker.transfer_async(1, STORE)


def test_a_media_pair_has_one_handler() -> None:
    worker = _worker(RecordingHandler())
    with pytest.raises(ConfigurationError, match="already registered"):
        worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, RecordingHandler())


# --------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_block_size": 0, "num_cpu_blocks": 4}, "gpu_block_size"),
        ({"gpu_block_size": 16, "offloaded_block_size": 24, "num_cpu_blocks": 4}, "multiple"),
        ({"gpu_block_size": 16}, "exactly one"),
        ({"gpu_block_size": 16, "num_cpu_blocks": 4, "cpu_bytes": 1024}, "exactly one"),
        ({"gpu_block_size": 16, "cpu_bytes": 1024}, "gpu_page_bytes"),
        ({"gpu_block_size": 16, "cpu_bytes": 100, "gpu_page_bytes": 64,
          "offloaded_block_size": 32}, "hold no offloaded block"),
        ({"gpu_block_size": 16, "num_cpu_blocks": 4, "cache_policy": "fifo"}, "cache_policy"),
        ({"gpu_block_size": 16, "num_cpu_blocks": 4, "store_threshold": 0}, "store_threshold"),
        ({"gpu_block_size": 16, "num_cpu_blocks": 4.0}, "num_cpu_blocks"),
    ],
)
def test_bad_configs_are_rejected_up_front(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        CPUOffloadingConfig(**kwargs)  # type: ignore[arg-type]


def test_spec_builds_the_manager_once() -> None:
    from kvoffload.impl.manager import CPUOffloadingManager
    from kvoffload.impl.reuse import FilterReusedOffloadingManager

    spec = CPUOffloadingSpec(CPUOffloadingConfig(
        16, offloaded_block_size=64, cpu_bytes=10_000, gpu_page_bytes=100,
        cache_policy="arc", enable_events=True))
    assert (spec.block_size_factor, spec.num_cpu_blocks) == (4, 25)
    manager = spec.get_manager()
    assert isinstance(manager, CPUOffloadingManager)
    assert manager.block_size == 64 and manager.cache_policy == "arc"
    assert spec.get_manager() is manager

    filtered = CPUOffloadingSpec(CPUOffloadingConfig(16, num_cpu_blocks=4, store_threshold=3))
    outer = filtered.get_manager()
    assert isinstance(outer, FilterReusedOffloadingManager)
    assert outer.store_threshold == 3
    assert isinstance(outer.backing, CPUOffloadingManager)


def test_spec_rejects_a_non_config() -> None:
    with pytest.raises(ConfigurationError):
        CPUOffloadingSpec({"gpu_block_size": 16})  # type: ignore[arg-type]


def test_importing_the_worker_package_does_not_import_torch() -> None:
    code = (
        "import sys, kvoffload, kvoffload.impl, kvoffload.impl.worker as w; "
        "w.CPUOffloadingSpec; w.OffloadingWorker; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


torch_needed = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("torch"), reason="needs torch"
)


@torch_needed
def test_spec_handlers_are_typed_pairs_and_check_page_bytes() -> None:
    from tests.worker.worker_helpers import make_caches

    caches = make_caches("cpu", 8, (16, 48))
    spec = CPUOffloadingSpec(CPUOffloadingConfig(
        16, offloaded_block_size=32, cpu_bytes=64 * 2 * 5, gpu_page_bytes=64))
    entries = list(spec.get_handlers(caches))
    assert [(src.medium(), dst.medium()) for src, dst, _ in entries] == [
        ("GPU", "CPU"), ("CPU", "GPU")
    ]
    assert spec.num_cpu_blocks == 5
    worker = spec.build_worker(caches)
    assert worker.transfer_async(1, (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([4])))
    assert [r.success for r in worker.get_finished()] == [True]
    with pytest.raises(ConfigurationError, match="other KV caches"):
        spec.build_worker(make_caches("cpu", 8, (16, 48)))

    mismatched = CPUOffloadingSpec(CPUOffloadingConfig(
        16, cpu_bytes=1000, gpu_page_bytes=100))
    with pytest.raises(ConfigurationError, match="gpu_page_bytes is 100"):
        mismatched.build_worker(caches)


@torch_needed
def test_a_malformed_spec_through_the_worker_is_a_failed_result() -> None:
    from tests.worker.worker_helpers import make_caches

    caches = make_caches("cpu", 8, (16,))
    worker = CPUOffloadingSpec(CPUOffloadingConfig(16, num_cpu_blocks=4)).build_worker(caches)
    before = caches.tensors[0].tensor.clone()
    assert not worker.transfer_async(1, (CPULoadStoreSpec([7]), GPULoadStoreSpec([0])))
    assert not worker.transfer_async(2, (CPULoadStoreSpec([0]), CPULoadStoreSpec([1])))
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(1, False), (2, False)]
    assert (caches.tensors[0].tensor == before).all()
