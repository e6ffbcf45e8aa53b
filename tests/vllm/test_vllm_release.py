"""The release loader on tiny fake release trees (no download).

Each fake tree is written here: a few lines per module, shaped like one
generation of vLLM's ``vllm/v1/kv_offload`` (names and signatures only), so
the loader's detection, stubbing and errors are tested without vLLM.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.vllm_release import (
    Generation,
    NoReleaseError,
    ReleaseImportError,
    VllmAlreadyImportedError,
    load_release,
    loaded_release,
    unload_release,
)

BASE_KEYS = """
from dataclasses import dataclass
from typing import Any, NewType
from vllm.logger import init_logger

logger = init_logger(__name__)
OffloadKey = NewType("OffloadKey", bytes)

@dataclass
class ReqContext:
    kv_transfer_params: Any = None

@dataclass
class PrepareStoreOutput:
    keys_to_store: list
    store_spec: object
    evicted_keys: list

@dataclass
class OffloadingEvent:
    keys: list
    medium: str
    removed: bool

class OffloadingManager:
    def touch(self, keys, req_context): ...
    def complete_load(self, keys, req_context): ...
"""

MANAGER = """
from vllm.v1.kv_offload.base import OffloadingManager

class CPUOffloadingManager(OffloadingManager):
    def __init__(self, num_blocks, cache_policy="lru", enable_events=False{extra}):
        self.num_blocks = num_blocks
        self.cache_policy = cache_policy

    def prepare_store(self, keys, req_context):
        return None
{methods}
"""

LRU = """
class LRUCachePolicy:
    pass
"""

REUSE = """
class FilterReusedOffloadingManager:
    def __init__(self, backing, store_threshold=2, max_tracker_size=64000):
        self.backing = backing
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
"""


def write_release(
    root: Path,
    *,
    version: str | None = "0.21.0",
    folded: bool = False,
    base: str = BASE_KEYS,
) -> Path:
    """A fake release: keys + context, the filter separate (0.21-shaped), or
    folded into the manager with ``reset_cache`` (0.22-shaped)."""
    package = root / "vllm" / "v1" / "kv_offload"
    (package / "cpu" / "policies").mkdir(parents=True)
    for init in (package, package / "cpu", package / "cpu" / "policies"):
        (init / "__init__.py").write_text("")
    (package / "base.py").write_text(base)
    extra = ", store_threshold=1, max_tracker_size=64000" if folded else ""
    methods = "    def reset_cache(self):\n        pass\n" if folded else ""
    (package / "cpu" / "manager.py").write_text(MANAGER.format(extra=extra, methods=methods))
    (package / "cpu" / "policies" / "lru.py").write_text(LRU)
    if not folded:
        (package / "reuse_manager.py").write_text(REUSE)
    if version is not None:
        info = root / f"vllm-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


@pytest.fixture(autouse=True)
def clean_vllm() -> Iterator[None]:
    """Each test starts and ends with no vllm imported."""
    if "vllm" in sys.modules:
        pytest.skip("a vllm is already imported in this test process")
    yield
    if loaded_release() is not None:
        unload_release()
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def test_detects_version_generation_and_classes(tmp_path: Path) -> None:
    release = load_release(write_release(tmp_path))
    assert release.version == "0.21.0"
    assert release.generation is Generation.V0_21
    assert release.features.separate_filter and not release.features.folded_filter
    assert not release.features.reset
    assert release.manager_cls.__name__ == "CPUOffloadingManager"
    assert release.filter_cls is not None
    # the logger module is missing from the tree: a stand-in served it
    assert release.stubbed == ("vllm.logger",)


def test_new_manager_wraps_the_separate_filter(tmp_path: Path) -> None:
    release = load_release(write_release(tmp_path))
    plain = release.new_manager(3, "arc")
    assert (plain.num_blocks, plain.cache_policy) == (3, "arc")
    filtered = release.new_manager(3, "lru", store_threshold=2, max_tracker_size=5)
    assert type(filtered).__name__ == "FilterReusedOffloadingManager"
    assert (filtered.store_threshold, filtered.max_tracker_size) == (2, 5)
    assert filtered.backing.num_blocks == 3
    context = release.new_context("r1")
    assert context.kv_transfer_params is None


def test_folded_filter_generation(tmp_path: Path) -> None:
    release = load_release(write_release(tmp_path, version="0.22.0", folded=True))
    assert release.generation is Generation.V0_22
    assert release.features.reset and release.filter_cls is None
    manager = release.new_manager(2, store_threshold=2)
    assert type(manager).__name__ == "CPUOffloadingManager"


def test_version_from_version_module(tmp_path: Path) -> None:
    root = write_release(tmp_path, version=None)
    (root / "vllm" / "version.py").write_text('__version__ = "0.99.1"\n')
    assert load_release(root).version == "0.99.1"


def test_version_unknown_without_metadata(tmp_path: Path) -> None:
    assert load_release(write_release(tmp_path, version=None)).version == "unknown"


def test_same_directory_twice_is_one_handle(tmp_path: Path) -> None:
    root = write_release(tmp_path)
    assert load_release(root) is load_release(root)


def test_directory_without_release(tmp_path: Path) -> None:
    with pytest.raises(NoReleaseError, match="holds no vLLM release"):
        load_release(tmp_path)
    with pytest.raises(NoReleaseError, match="no such directory"):
        load_release(tmp_path / "missing")
    assert "vllm" not in sys.modules


def test_another_release_already_loaded(tmp_path: Path) -> None:
    first = write_release(tmp_path / "a")
    second = write_release(tmp_path / "b", version="0.22.0", folded=True)
    load_release(first)
    with pytest.raises(VllmAlreadyImportedError, match="already imported"):
        load_release(second)
    unload_release()
    assert load_release(second).generation is Generation.V0_22


def test_foreign_vllm_already_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    with pytest.raises(VllmAlreadyImportedError):
        load_release(write_release(tmp_path))
    with pytest.raises(VllmAlreadyImportedError):
        unload_release()


def test_unstubbed_import_is_a_typed_error(tmp_path: Path) -> None:
    root = write_release(tmp_path, base=BASE_KEYS + "\nfrom vllm.not_a_module import x\n")
    with pytest.raises(ReleaseImportError, match="vllm.v1.kv_offload.base"):
        load_release(root)
    # a failed load leaves nothing behind
    assert not [name for name in sys.modules if name.startswith("vllm")]
    assert loaded_release() is None


def test_unloading_forgets_the_modules_bound_to_the_release(tmp_path: Path) -> None:
    """kvoffload.vllm subclasses the loaded release's classes: once the
    release is forgotten, a stale kvoffload.vllm would make the next
    release's factory reject the spec (``issubclass`` fails), as the
    opt-in bench tests followed by the face tests did."""
    load_release(write_release(tmp_path))
    stale = types.ModuleType("kvoffload.vllm")
    sys.modules["kvoffload.vllm"] = stale
    try:
        unload_release()
        assert "kvoffload.vllm" not in sys.modules
    finally:
        if sys.modules.get("kvoffload.vllm") is stale:
            del sys.modules["kvoffload.vllm"]
