"""Loading vLLM's C file I/O for ``bench tier``: the ELF reading and the
redirection of the torch and CUDA libraries it is linked against."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvoffload.bench.vllm_fs_io import ElfError, needed_libraries, redirect_torch_libraries

ELF_HOST = sys.platform == "linux" and sys.byteorder == "little" and sys.maxsize > 2**32


def extension_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".so"):
        pytest.skip(f"{name} is not a shared object here")
    return Path(spec.origin)


@pytest.mark.skipif(not ELF_HOST, reason="reads 64-bit little-endian ELF files")
def test_the_libraries_an_extension_needs_are_read_from_its_dynamic_section() -> None:
    image = extension_file("_ctypes").read_bytes()
    names = [name for _, name in needed_libraries(image)]
    assert any(name.startswith(b"libffi") for name in names), names
    for at, name in needed_libraries(image):
        assert image[at : at + len(name) + 1] == name + b"\0"


@pytest.mark.skipif(not ELF_HOST, reason="reads 64-bit little-endian ELF files")
def test_torch_libraries_are_pointed_at_libc_and_nothing_else_changes() -> None:
    pytest.importorskip("torch")
    image = extension_file("torch._C").read_bytes()
    before = needed_libraries(image)
    assert any(name.startswith(b"libtorch") for _, name in before)
    patched, redirected = redirect_torch_libraries(image)
    after = needed_libraries(patched)
    assert len(patched) == len(image)
    assert redirected == [n.decode() for _, n in before if n.startswith((b"libtorch", b"libc10"))]
    for (at, old), (_, new) in zip(before, after, strict=True):
        expected = b"libc.so.6" if old.decode() in redirected else old
        assert new == expected
        assert patched[at : at + len(old)].rstrip(b"\0") == expected
    changed = {i for i, (a, b) in enumerate(zip(image, patched, strict=True)) if a != b}
    spans = {i for at, old in before if old.decode() in redirected for i in range(at, at + len(old))}
    assert changed <= spans, "only the redirected names' bytes change"


def test_a_file_that_is_not_elf_is_refused() -> None:
    with pytest.raises(ElfError):
        needed_libraries(b"MZ\x90\x00" + bytes(60))
