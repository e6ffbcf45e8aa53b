"""Property-based boundary test (issue "hard edges"): over the argument
space of the public calls, the worker's specs and the command line, every
call either succeeds or raises a typed error with nothing changed (state,
and bytes for the worker); every usage error exits 2 with one line on
stderr and no traceback."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.__main__ import main
from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.errors import OffloadingError, TransferError
from kvoffload.spec.keys import make_offload_key

GOOD_KEYS = [make_offload_key(bytes([i]), 0) for i in range(4)]


class EngineContext:
    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


keys_st = st.one_of(
    st.sampled_from(GOOD_KEYS),
    st.sampled_from(GOOD_KEYS).map(lambda key: memoryview(key)),
    st.sampled_from(GOOD_KEYS).map(bytearray),
    st.sampled_from([b"", b"abc", "abcdef", 7, None, 1.5]),
)
key_lists_st = st.one_of(
    st.lists(keys_st, max_size=4),
    st.lists(st.sampled_from(GOOD_KEYS), max_size=4),
    st.lists(st.sampled_from(GOOD_KEYS), max_size=4).map(tuple),
    keys_st,  # a bare key where a list is expected
)
ctx_st = st.one_of(
    st.just(ReqContext("r")), st.just(EngineContext("e")),
    st.sampled_from([None, 42, "r", object()]),
)
success_st = st.sampled_from([True, False, "no", None, 1, 0])

CALLS: dict[str, Callable[[Any, st.DataObject], object]] = {
    "lookup": lambda m, d: m.lookup(d.draw(keys_st), d.draw(ctx_st)),
    "lookup_prefix": lambda m, d: m.lookup_prefix(d.draw(key_lists_st), d.draw(ctx_st)),
    "prepare_store": lambda m, d: m.prepare_store(d.draw(key_lists_st), d.draw(ctx_st)),
    "complete_store": lambda m, d: m.complete_store(
        d.draw(key_lists_st), d.draw(ctx_st), d.draw(success_st)
    ),
    "prepare_load": lambda m, d: m.prepare_load(d.draw(key_lists_st), d.draw(ctx_st)),
    "complete_load": lambda m, d: m.complete_load(d.draw(key_lists_st), d.draw(ctx_st)),
    "touch": lambda m, d: m.touch(d.draw(key_lists_st), d.draw(ctx_st)),
    "reset_cache": lambda m, d: m.reset_cache(),
    "on_new_request": lambda m, d: m.on_new_request(d.draw(ctx_st)),
    "on_request_finished": lambda m, d: m.on_request_finished(d.draw(ctx_st)),
}


def snapshot(manager: Any) -> object:
    core = getattr(manager, "backing", manager)
    return (
        sorted((k, b.ref_cnt, b.block_id) for k, b in core.policy.items()),
        repr(core.policy_state()),
        core.backend.get_num_free_blocks(),
        list(core.events or []),
        dict(getattr(manager, "counts", {})),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), policy=st.sampled_from(["lru", "arc"]), filtered=st.booleans())
def test_every_manager_call_succeeds_or_raises_typed_with_nothing_changed(
    data: st.DataObject, policy: str, filtered: bool
) -> None:
    core = CPUOffloadingManager(16, 3, policy, enable_events=True)
    manager: Any = FilterReusedOffloadingManager(core) if filtered else core
    for _ in range(data.draw(st.integers(1, 12))):
        name = data.draw(st.sampled_from(sorted(CALLS)))
        before = snapshot(manager)
        try:
            CALLS[name](manager, data)
        except OffloadingError:
            assert snapshot(manager) == before, name
        # any other exception fails the test: no raw errors at the boundary


block_id_st = st.one_of(
    st.integers(-3, 20), st.just(2**70), st.floats(allow_nan=False), st.booleans(),
    st.text(max_size=2), st.none(), st.lists(st.integers(0, 3), max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(block_id_st, max_size=4), gpu=st.booleans())
def test_a_spec_keeps_its_ids_exactly_or_is_refused(ids: list[object], gpu: bool) -> None:
    cls = GPULoadStoreSpec if gpu else CPULoadStoreSpec
    exact = all(type(i) is int and 0 <= i < 2**63 for i in ids)
    if exact:
        assert cls(ids).block_ids.tolist() == ids  # type: ignore[arg-type]
    else:
        with pytest.raises(TransferError):
            cls(ids)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    job_id=st.one_of(st.integers(0, 3), st.sampled_from([None, "a", [1], True, 1.0])),
    gpu_ids=st.lists(st.integers(0, 20), max_size=4),
    cpu_ids=st.lists(st.integers(0, 8), max_size=3),
    store=st.booleans(),
)
def test_a_worker_transfer_is_a_result_or_a_typed_error_with_bytes_unchanged(
    job_id: object, gpu_ids: list[int], cpu_ids: list[int], store: bool
) -> None:
    torch = pytest.importorskip("torch")
    from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
    from tests.worker.worker_helpers import make_caches

    caches = make_caches("cpu", 16, (16,))
    worker = CPUOffloadingSpec(CPUOffloadingConfig(16, num_cpu_blocks=6)).build_worker(caches)
    gpu, cpu = GPULoadStoreSpec(gpu_ids), CPULoadStoreSpec(cpu_ids)
    spec = (gpu, cpu) if store else (cpu, gpu)
    before = caches.tensors[0].tensor.clone()
    try:
        accepted = worker.transfer_async(job_id, spec)  # type: ignore[arg-type]
    except TransferError:
        assert torch.equal(caches.tensors[0].tensor, before)
        assert worker.get_finished() == []
        return
    worker.wait([job_id])  # type: ignore[list-item]
    results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(job_id, accepted)]
    if not accepted or store:  # a failed transfer, or a store, leaves the GPU alone
        assert torch.equal(caches.tensors[0].tensor, before)


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
    return status, err.getvalue()


BAD_VALUES = ["0", "-5", "abc", "1.5", "", "100000000", "1P"]
BAD_OPTIONS: dict[str, list[tuple[str, list[str]]]] = {
    "audit": [("--steps", ["0", "-5", "abc", "100000000"]), ("--examples", ["0", "x"]),
              ("--reuse-threshold", ["1", "-3", "x"]), ("--tracker-size", ["0", "-5"]),
              ("--policy", ["lfu"]), ("--target", ["nomodule", "kvoffload:nothing"])],
    "check": [("--depth", ["0", "100", "x"]), ("--keys", ["0", "100000"]),
              ("--blocks", ["0", "9"]), ("--reuse-threshold", ["1"])],
    "simulate": [("--capacity", ["0", "-1", "x"]), ("--workload", ["/nonexistent/trace"])],
    "bench manager": [("--requests", ["0", "x"]), ("--rounds", ["0"]),
                      ("--vllm-path", ["/nonexistent"])],
    "bench transfer": [("--sizes", ["abc", "0", "1P"]), ("--repeats", ["0"]),
                       ("--threads", ["0"]), ("--direct-copy-min-bytes", ["-5"]),
                       ("--total", ["1P", "100G", "0"]), ("--json", ["/nonexistent/x"])],
}
CASES = [
    (command, option, value)
    for command, options in BAD_OPTIONS.items()
    for option, values in options
    for value in values
]


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), extra=st.sampled_from([[], ["--seed", "3"]]))
def test_every_usage_error_exits_2_with_one_line(
    case: tuple[str, str, str], extra: list[str]
) -> None:
    command, option, value = case
    argv = [*command.split(), option, value, *(extra if command != "check" else [])]
    status, err = run_cli(argv)
    assert status == 2, (argv, err)
    assert err.count("\n") == 1 and err.endswith("\n"), (argv, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(c))
def test_each_listed_usage_error_exits_2(case: tuple[str, str, str]) -> None:
    command, option, value = case
    status, err = run_cli([*command.split(), option, value])
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("source", "argv"),
    [
        ("raise RuntimeError('boom')\n", ["audit", "--target", "edges_target:make"]),
        ("def (:\n", ["audit", "--target", "edges_target:make"]),
        ("def (:\n", ["check", "--target", "edges_target:make"]),
        ("def make(n):\n    raise ValueError('no')\n", ["audit", "--target", "edges_target:make"]),
    ],
    ids=["module-raises", "syntax-error", "check-syntax-error", "factory-raises"],
)
def test_a_target_that_cannot_load_is_a_usage_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, source: str, argv: list[str]
) -> None:
    (tmp_path / "edges_target.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "edges_target", raising=False)
    status, err = run_cli(argv)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["audit", "--vllm"], ["bench", "manager", "--vllm-path"]])
def test_a_broken_vllm_release_is_a_usage_error(tmp_path: Any, command: list[str]) -> None:
    package = tmp_path / "vllm" / "v1" / "kv_offload"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def (:\n")
    status, err = run_cli([*command, str(tmp_path)])
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
