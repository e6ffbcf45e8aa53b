"""Types of the C chunk I/O (``_chunkio.c``; the compiled build only)."""

from collections.abc import Sequence

def crc32(data: memoryview | bytes, value: int = 0, /) -> int: ...
def clmul_crc32() -> bool: ...
def read_chunks(
    paths: Sequence[str], payloads: Sequence[memoryview], spare: memoryview, direct: bool, /
) -> list[int]: ...
def write_chunks(
    temps: Sequence[str],
    prefixes: Sequence[str],
    suffix: str,
    payloads: Sequence[memoryview],
    recycled: Sequence[str | None],
    fsync: int,
    direct: bool,
    crc_function: int,
    crc_kind: int,
    /,
) -> list[int]: ...
