"""Types of the C chunk I/O (``_chunkio.c``; the compiled build only)."""

from collections.abc import Sequence

def read_chunks(
    paths: Sequence[str], payloads: Sequence[memoryview], spare: memoryview, direct: bool, /
) -> list[int]: ...
def write_chunk(
    temp_path: str,
    final_path: str,
    payload: memoryview,
    fsync: int,
    direct: bool,
    recycled: str | None,
    /,
) -> None: ...
