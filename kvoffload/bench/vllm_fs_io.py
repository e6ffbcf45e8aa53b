"""vLLM's fs tier as vLLM runs it: with its C file I/O (``vllm.fs_io_C``).

vLLM 0.33's wheel ships ``vllm/fs_io_C.abi3.so``: the fs tier's batch load
and store, made in C with the interpreter lock released once per batch. The
tier's Python functions (``tiering/fs/io.py``) are its fallback, used only
where that module fails to import. ``bench tier`` compares kvoffload's tier
with vLLM's as installed, so it loads the release's module
(``scripts/fetch_vllm.py`` extracts it).

The module is linked against torch's and CUDA's libraries (``libtorch.so``,
``libc10_cuda.so``, ``libnvrtc.so.13``, ...) without using any of their
symbols, so on a machine without a matching CUDA build of torch (this
project's CPU-only CI, a GPU machine with another torch) it does not load.
There, :func:`load_fs_io` loads a copy whose dependencies on those libraries
are pointed at the C library: the same machine code, and the loader still
resolves every symbol it uses (imports are bound at load time, so a symbol
the module did need would fail the load, and the bench then says it runs
the fallback). :func:`load_fs_io` says which it did.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import struct
import sys
import tempfile
from pathlib import Path

MODULE = "vllm.fs_io_C"

_REDIRECTED_PREFIXES = (b"libtorch", b"libc10", b"libnvrtc", b"libcuda", b"libcudart")
_LIBC = b"libc.so.6"
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


class ElfError(ValueError):
    """The file is not a 64-bit little-endian ELF shared object."""


def needed_libraries(image: bytes) -> list[tuple[int, bytes]]:
    """The ``DT_NEEDED`` entries of a 64-bit little-endian ELF image: each
    name's file offset and the name."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", image, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", image, 0x36)
    loads: list[tuple[int, int, int]] = []
    dynamic: tuple[int, int] | None = None
    for index in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", image, phoff + index * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        raise ElfError("no dynamic section")

    def file_offset(address: int) -> int:
        for vaddr, offset, size in loads:
            if vaddr <= address < vaddr + size:
                return offset + address - vaddr
        raise ElfError(f"address {address:#x} is in no loaded segment")

    strtab: int | None = None
    needed: list[int] = []
    start, size = dynamic
    for entry in range(start, start + size, 16):
        tag, value = struct.unpack_from("<qQ", image, entry)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed.append(value)
        elif tag == _DT_STRTAB:
            strtab = file_offset(value)
    if strtab is None:
        raise ElfError("no string table")
    names = []
    for value in needed:
        at = strtab + value
        names.append((at, image[at : image.index(b"\0", at)]))
    return names


def redirect_torch_libraries(image: bytes) -> tuple[bytes, list[str]]:
    """``image`` with each torch or CUDA library it needs renamed to the C
    library (padded with NULs; names shorter than ``libc.so.6`` stay), and
    the names redirected."""
    patched = bytearray(image)
    redirected = []
    for at, name in needed_libraries(image):
        if name.startswith(_REDIRECTED_PREFIXES) and len(name) >= len(_LIBC):
            patched[at : at + len(name)] = _LIBC.ljust(len(name), b"\0")
            redirected.append(name.decode())
    return bytes(patched), redirected


def _find_module_file(root: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = root / "vllm" / f"fs_io_C{suffix}"
        if candidate.is_file():
            return candidate
    return None


def load_fs_io(root: Path, python_io: bool = False) -> str:
    """Make ``vllm.fs_io_C`` importable for the release under ``root``
    (loaded with :func:`kvoffload.vllm_release.load_release`, before its fs
    tier is imported), or, with ``python_io``, make its import fail so the
    tier runs its Python fallback. Returns how vLLM's tier does its I/O."""
    if python_io:
        sys.modules[MODULE] = None  # type: ignore[assignment]  # the import fails
        return "Python I/O (fallback, --vllm-python-io)"
    path = _find_module_file(root)
    if path is None:
        return (
            "Python I/O (fallback: no vllm/fs_io_C in the release directory; "
            "fetch it again with scripts/fetch_vllm.py)"
        )
    try:
        importlib.import_module(MODULE)
        return "C I/O (vllm.fs_io_C)"
    except ImportError as error:
        reason = str(error)
    sys.modules.pop(MODULE, None)
    try:
        patched, redirected = redirect_torch_libraries(path.read_bytes())
    except (ElfError, OSError, struct.error) as error:
        return f"Python I/O (fallback: vllm.fs_io_C does not load here: {reason}; {error})"
    with tempfile.TemporaryDirectory(prefix="kvoffload-fs-io-") as scratch:
        copy = Path(scratch) / path.name
        copy.write_bytes(patched)
        os.chmod(copy, 0o755)
        spec = importlib.util.spec_from_file_location(MODULE, copy)
        if spec is None or spec.loader is None:
            return f"Python I/O (fallback: cannot load {copy})"
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # dlopen: the file may go afterwards
        except ImportError as error:
            return f"Python I/O (fallback: vllm.fs_io_C does not load here: {reason}; {error})"
    sys.modules[MODULE] = module
    return f"C I/O (vllm.fs_io_C; {', '.join(redirected)} pointed at libc: none is used)"
