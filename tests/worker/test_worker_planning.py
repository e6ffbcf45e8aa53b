"""The index arithmetic of transfers, checked against a per-block reference
(pure numpy: no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.planning import _has_repeats, map_block_rows, plan_row_copies
from kvoffload.spec.errors import TransferError


def reference_rows(
    gpu_groups: list[list[int]], cpu_groups: list[list[int]], skips: list[int], factor: int
) -> list[tuple[int, int]]:
    """(gpu row, cpu row) pairs, one block at a time."""
    pairs = []
    for gpu_ids, cpu_ids, skip in zip(gpu_groups, cpu_groups, skips):
        for position, gpu_id in enumerate(gpu_ids):
            sub_block = skip + position
            cpu_block = cpu_ids[sub_block // factor]
            pairs.append((gpu_id, cpu_block * factor + sub_block % factor))
    return pairs


@st.composite
def load_case(draw: st.DrawFn) -> tuple[GPULoadStoreSpec, CPULoadStoreSpec, int, list[tuple[int, int]]]:
    factor = draw(st.integers(1, 4))
    num_groups = draw(st.integers(1, 3))
    gpu_groups: list[list[int]] = []
    cpu_groups: list[list[int]] = []
    indices: list[int] = []
    gpu_pool = iter(draw(st.permutations(range(64))))
    for _ in range(num_groups):
        size = draw(st.integers(0, 6))
        index = draw(st.integers(0, 20))
        skip = index % factor
        cpu_count = 0 if size == 0 else -(-(skip + size) // factor)
        gpu_groups.append([next(gpu_pool) for _ in range(size)])
        cpu_groups.append(draw(st.lists(st.integers(0, 15), min_size=cpu_count, max_size=cpu_count)))
        indices.append(index)
    gpu_spec = GPULoadStoreSpec(
        [b for group in gpu_groups for b in group],
        [len(group) for group in gpu_groups],
        indices,
    )
    cpu_spec = CPULoadStoreSpec([b for group in cpu_groups for b in group])
    expected = reference_rows(gpu_groups, cpu_groups, [i % factor for i in indices], factor)
    return gpu_spec, cpu_spec, factor, expected


@settings(max_examples=200, deadline=None)
@given(load_case())
def test_load_rows_match_the_per_block_reference(
    case: tuple[GPULoadStoreSpec, CPULoadStoreSpec, int, list[tuple[int, int]]],
) -> None:
    gpu_spec, cpu_spec, factor, expected = case
    rows = map_block_rows(
        gpu_spec, cpu_spec, block_size_factor=factor, num_groups=len(gpu_spec.group_sizes),
        num_gpu_blocks=64, num_cpu_blocks=16, to_cpu=False,
    )
    assert list(zip(rows.gpu_rows.tolist(), rows.cpu_rows.tolist())) == expected
    assert rows.group_of_row.tolist() == [
        group for group, size in enumerate(gpu_spec.group_sizes) for _ in range(size)
    ]


def _rows(gpu: GPULoadStoreSpec, cpu: CPULoadStoreSpec, *, factor: int = 2,
          groups: int = 1, to_cpu: bool = False) -> object:
    return map_block_rows(gpu, cpu, block_size_factor=factor, num_groups=groups,
                          num_gpu_blocks=8, num_cpu_blocks=4, to_cpu=to_cpu)


def test_a_load_may_start_part_way_into_its_first_block() -> None:
    rows = map_block_rows(
        GPULoadStoreSpec([7, 0, 5], None, [3]), CPULoadStoreSpec([2, 0]),
        block_size_factor=2, num_groups=1, num_gpu_blocks=8, num_cpu_blocks=4, to_cpu=False,
    )
    # block index 3 is the second half of offloaded block 1 (CPU slot 2)
    assert rows.cpu_rows.tolist() == [5, 0, 1]


@pytest.mark.parametrize(
    ("gpu", "cpu", "kwargs", "message"),
    [
        (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([0, 1]), {}, "need 1 CPU blocks"),
        (GPULoadStoreSpec([0, 8]), CPULoadStoreSpec([0]), {}, "GPU block id 8"),
        (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([4]), {}, "CPU block id 4"),
        (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([0]), {"groups": 2}, "1 KV-cache groups"),
        (GPULoadStoreSpec([0, 0]), CPULoadStoreSpec([1]), {}, "more than once"),
        (GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([1, 1]), {"factor": 1, "to_cpu": True}, "more than once"),
        (GPULoadStoreSpec([0], None, [0]), CPULoadStoreSpec([1]), {"to_cpu": True}, "whole offloaded blocks"),
        (GPULoadStoreSpec([0, 1], None, [1]), CPULoadStoreSpec([1, 2]), {"to_cpu": True}, "whole offloaded blocks"),
    ],
)
def test_malformed_pairs_raise(
    gpu: GPULoadStoreSpec, cpu: CPULoadStoreSpec, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TransferError, match=message):
        _rows(gpu, cpu, **kwargs)  # type: ignore[arg-type]


def test_loads_may_read_a_cpu_block_twice() -> None:
    rows = map_block_rows(
        GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([3, 3]), block_size_factor=1,
        num_groups=1, num_gpu_blocks=8, num_cpu_blocks=4, to_cpu=False,
    )
    assert rows.cpu_rows.tolist() == [3, 3]


@st.composite
def row_mapping(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """src rows from runs at drawn starts; dst rows unique, from the same run
    lengths laid out in a drawn order (so some runs line up, some do not)."""
    lengths = draw(st.lists(st.integers(1, 5), max_size=10))
    src = [start + i for length in lengths
           for start in [draw(st.integers(0, 40))] for i in range(length)]
    bases = np.cumsum([0] + lengths)[:-1].tolist()
    order = draw(st.permutations(range(len(lengths))))
    dst = [bases[chunk] + i for chunk in order for i in range(lengths[chunk])]
    # pair the k-th src row with the k-th dst row
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(row_mapping(), st.integers(0, 6), st.integers(1, 3))
def test_plan_reproduces_the_row_mapping_with_maximal_runs(
    mapping: tuple[np.ndarray, np.ndarray], threshold_rows: int, row_bytes: int
) -> None:
    src, dst = mapping
    plan = plan_row_copies(
        src, dst, row_bytes=row_bytes, direct_min_bytes=threshold_rows * row_bytes
    )
    mapped: dict[int, int] = {}
    for s, d, length in zip(plan.run_src.tolist(), plan.run_dst.tolist(),
                            plan.run_lengths.tolist()):
        assert length >= max(threshold_rows, 1)
        for i in range(length):
            mapped[d + i] = s + i
    for s, d in zip(plan.gather_src.tolist(), plan.gather_dst.tolist()):
        assert d not in mapped
        mapped[d] = s
    assert mapped == dict(zip(dst.tolist(), src.tolist()))
    assert plan.num_rows == src.shape[0]
    position = {d: k for k, d in enumerate(dst.tolist())}
    for s, d, length in zip(plan.run_src.tolist(), plan.run_dst.tolist(),
                            plan.run_lengths.tolist()):
        first, last = position[d], position[d] + length - 1
        # a run is contiguous in the sequence and cannot be extended
        assert src[first:last + 1].tolist() == list(range(s, s + length))
        if last + 1 < src.shape[0]:
            assert not (src[last + 1] == s + length and dst[last + 1] == d + length)
        if first > 0:
            assert not (src[first - 1] == s - 1 and dst[first - 1] == d - 1)


def test_plan_coalesces_contiguous_rows_into_one_run() -> None:
    src = np.arange(10, 20, dtype=np.int64)
    dst = np.arange(0, 10, dtype=np.int64)
    plan = plan_row_copies(src, dst, row_bytes=4, direct_min_bytes=8)
    assert plan.run_lengths.tolist() == [10]
    assert plan.gather_src.shape[0] == 0


def test_plan_batches_short_runs_in_order() -> None:
    src = np.array([5, 9, 10, 11, 2], dtype=np.int64)
    dst = np.array([0, 1, 2, 3, 7], dtype=np.int64)
    plan = plan_row_copies(src, dst, row_bytes=4, direct_min_bytes=12)
    assert (plan.run_src.tolist(), plan.run_dst.tolist(), plan.run_lengths.tolist()) == ([9], [1], [3])
    assert plan.gather_src.tolist() == [5, 2]
    assert plan.gather_dst.tolist() == [0, 7]


@given(
    rows=st.lists(st.integers(0, 299), max_size=40),
    spare=st.sampled_from([0, 1, 10**6]),
)
def test_repeated_destinations_are_found_by_mask_and_by_sort(rows: list[int], spare: int) -> None:
    """Both ways of finding a repeated destination row (a mask over a small
    range, a sort over a large one) agree with a set."""
    array = np.asarray(rows, dtype=np.int64)
    limit = 300 + spare
    assert _has_repeats(array, limit) == (len(set(rows)) != len(rows))


def test_a_store_naming_a_cpu_row_twice_is_refused_in_a_large_tier() -> None:
    with pytest.raises(TransferError, match="more than once"):
        map_block_rows(
            GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([5, 5]),
            block_size_factor=1, num_groups=1, num_gpu_blocks=4,
            num_cpu_blocks=10**7, to_cpu=True,
        )
