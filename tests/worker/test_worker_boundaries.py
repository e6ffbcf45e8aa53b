"""The worker's error contract at its boundary (issue "hard edges"): block ids
are exact ints checked when a spec is built; a malformed call raises
TransferError with nothing recorded, reported or copied; each submission is
reported once; nothing is accepted after shutdown."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.impl.specs import BlockIDsLoadStoreSpec, CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.errors import TransferError
from tests.worker.test_worker_routing import LOAD, STORE, RecordingHandler, _worker

BAD_IDS: list[object] = [
    [1.7], [9.9], ["2"], [True], [[1, 2]], [2**70], [-1], "12", 5, None,
    np.array([1.5]), np.array([[1, 2]]), np.array([True]), np.array([2**64 - 1], dtype=np.uint64),
]


@pytest.mark.parametrize("spec_cls", [CPULoadStoreSpec, GPULoadStoreSpec])
@pytest.mark.parametrize("ids", BAD_IDS, ids=repr)
def test_a_malformed_block_id_is_refused_when_the_spec_is_built(
    spec_cls: type[BlockIDsLoadStoreSpec], ids: object
) -> None:
    with pytest.raises(TransferError):
        spec_cls(ids)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "ids", [[], [0], [3, 1, 2], [2**63 - 1], (i for i in range(3)), np.array([4, 5]),
            [np.int32(3)], np.array([7], dtype=np.uint8)], ids=repr
)
def test_well_formed_block_ids_are_kept_exactly(ids: object) -> None:
    expected = [int(i) for i in list(ids)] if not hasattr(ids, "__next__") else [0, 1, 2]  # type: ignore[call-overload]
    spec = CPULoadStoreSpec(ids)  # type: ignore[arg-type]
    assert spec.block_ids.dtype == np.int64 and spec.block_ids.tolist() == expected


BAD_CALLS: list[tuple[object, object]] = [
    (7, None), (7, (STORE[0], STORE[1], STORE[1])), (7, (1, 2)), (7, STORE[0]),
    ([1], STORE), (None, STORE), ("a", STORE), (True, STORE), (1.0, STORE),
]


@pytest.mark.parametrize(("job_id", "spec"), BAD_CALLS, ids=repr)
def test_a_malformed_submission_raises_and_records_nothing(job_id: object, spec: object) -> None:
    handler = RecordingHandler()
    worker = _worker(handler)
    with pytest.raises(TransferError):
        worker.transfer_async(job_id, spec)  # type: ignore[arg-type]
    assert handler.pending == [] and worker.get_finished() == []


@pytest.mark.parametrize("job_ids", [5, None, "12", [None], [1.5], [[1]]], ids=repr)
def test_wait_demands_a_collection_of_job_ids(job_ids: object) -> None:
    worker = _worker(RecordingHandler())
    assert worker.transfer_async(1, STORE)
    with pytest.raises(TransferError):
        worker.wait(job_ids)  # type: ignore[arg-type]
    worker.wait([1, 99])  # unknown ids are ignored
    assert [r.job_id for r in worker.get_finished()] == [1]


def test_a_failed_job_id_is_reported_once_even_when_resubmitted() -> None:
    worker = _worker(RecordingHandler())
    assert not worker.transfer_async(3, LOAD)  # no CPU -> GPU handler: fails
    with pytest.raises(TransferError, match="not yet reported"):
        worker.transfer_async(3, STORE)
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(3, False)]
    assert worker.transfer_async(3, STORE)  # reported: the id is free again
    worker.wait([3])
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(3, True)]


def test_no_submission_after_shutdown() -> None:
    handler = RecordingHandler()
    worker = _worker(handler)
    worker.shutdown()
    with pytest.raises(TransferError, match="shut down"):
        worker.transfer_async(1, STORE)
    assert handler.pending == [] and worker.get_finished() == []


@settings(max_examples=60, deadline=None)
@given(
    job_id=st.one_of(st.integers(-5, 5), st.none(), st.text(max_size=2), st.floats(), st.booleans()),
    spec=st.one_of(
        st.just(STORE), st.just(LOAD), st.none(), st.integers(),
        st.tuples(st.integers(), st.integers()), st.just((STORE[0],)),
    ),
)
def test_every_submission_is_a_result_or_a_typed_error_with_nothing_recorded(
    job_id: object, spec: object
) -> None:
    handler = RecordingHandler()
    worker = _worker(handler)
    try:
        accepted = worker.transfer_async(job_id, spec)  # type: ignore[arg-type]
    except TransferError:
        assert handler.pending == [] and worker.get_finished() == []
        return
    results = worker.get_finished()
    assert [r.job_id for r in results] == [job_id]
    assert results[0].success is accepted


def test_the_issue_overwrite_cannot_happen() -> None:
    """GPU block 9 into CPU slot "1.7" used to land in slot 1."""
    worker = OffloadingWorker()
    with pytest.raises(TransferError):
        worker.transfer_async(2, (GPULoadStoreSpec([9]), CPULoadStoreSpec([1.7])))  # type: ignore[list-item]
