"""Request traces for the simulator and the benchmarks, and seeded generators.

The trace format
================

A trace is a JSON Lines file: one JSON object per line, in request order.
Blank lines and lines starting with ``#`` are ignored. An optional first
object is a header::

    {"kvoffload_trace": 1, "workload": "multi-turn", "seed": 0}

Every other object is one request, in one of two forms:

``{"id": "r7", "keys": ["9f3a…", "0b11…", …]}``
    The request's chain of block keys, prefix first: each key is the block
    hash as a hex string (or a JSON integer, taken as an opaque id). Block
    hashes are chain hashes, so a key fixes the whole prefix before it: the
    loader rejects a trace in which one key follows two different keys, or
    appears twice in one chain.

``{"id": "r7", "segments": [["system-2", 12], ["conv-40", 9]]}``
    The chain derives from named token streams: take the first 12 blocks of
    stream ``system-2``, then the first 9 blocks of stream ``conv-40``. A
    block is identified by its stream, its index in the stream and the
    whole prefix before it, exactly as chain hashing identifies it; so a
    later ``[["system-2", 12], ["conv-40", 15]]`` (the next turn) extends
    this chain, and ``[["system-3", 12], ["conv-40", 9]]`` shares no block
    with it.

``id`` is optional (the line number is used instead). A request has at least
one block. Bounds (each broken bound is a :class:`TraceFormatError`): a line
holds at most :data:`MAX_LINE_CHARS` characters (which also bounds JSON
nesting), a request at most :data:`MAX_REQUEST_BLOCKS` blocks, a trace at
most :data:`MAX_TRACE_BLOCKS` block references; the file is UTF-8. A string
key is hex only: integers and strings never name the same block.

Generators
==========

:data:`WORKLOADS` maps a name to a seeded generator of request records (the
``segments`` form). The same name, request count and seed give the same
trace on every run and platform.

- ``shared-prompts``: a few system prompts, Zipf-popular, each followed by a
  short unique user message.
- ``multi-turn``: conversations that grow turn by turn over a shared system
  prompt, interleaved.
- ``zipf-docs``: a large catalogue of documents read with Zipf popularity,
  each followed by a unique question (popularity skew).
- ``scan``: a hot set of reused prefixes polluted by long one-off scans.
- ``one-off``: mostly short one-off documents, read once, around a small
  reused set.
- ``mixed``: multi-turn, shared prompts and one-off requests together.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs

from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.spec.keys import OffloadKey, make_offload_key

TRACE_FORMAT_VERSION = 1
"""Value of ``kvoffload_trace`` in a trace header."""


MAX_LINE_CHARS = 1 << 24
"""Longest line of a trace file (16 Mi characters)."""
MAX_REQUEST_BLOCKS = 1_000_000
"""Most blocks of one request (its chain length)."""
MAX_TRACE_BLOCKS = 10_000_000
"""Most block references in one trace (the sum of every chain's length)."""


class TraceFormatError(OffloadingError, ValueError):
    """A trace file or record is malformed; ``line`` is 1-based (0: unknown)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@attrs.frozen
class RequestRecord:
    """One request as written in a trace: ``keys`` or ``segments``, not both.

    ``line`` is where it was read from (0 when generated), for error messages.
    """

    req_id: str
    segments: tuple[tuple[str, int], ...] = ()
    keys: tuple[str, ...] | None = None
    line: int = attrs.field(default=0, eq=False)

    def to_json(self) -> str:
        if self.keys is not None:
            return json.dumps({"id": self.req_id, "keys": list(self.keys)})
        return json.dumps(
            {"id": self.req_id, "segments": [[name, n] for name, n in self.segments]},
            separators=(", ", ": "),
        )


@attrs.frozen(eq=False)
class Trace:
    """A compiled trace: each request's chain of block ids, prefix first.

    Block ids are dense ints in ``[0, num_blocks)``; ``block_keys[i]`` is the
    :data:`OffloadKey` of block ``i`` (group 0). Two requests share a block id
    exactly when they share that block and its whole prefix.
    """

    name: str
    req_ids: tuple[str, ...]
    chains: tuple[tuple[int, ...], ...]
    block_keys: tuple[OffloadKey, ...]

    @property
    def num_requests(self) -> int:
        return len(self.chains)

    @property
    def num_blocks(self) -> int:
        """Distinct blocks referenced by the trace (its working set)."""
        return len(self.block_keys)

    @property
    def num_block_refs(self) -> int:
        """Total blocks requested: the sum of the chain lengths."""
        return sum(len(chain) for chain in self.chains)

    def key_chains(self) -> list[list[OffloadKey]]:
        """Each request's chain as offload keys."""
        keys = self.block_keys
        return [[keys[block] for block in chain] for chain in self.chains]


def block_key(block_id: int) -> OffloadKey:
    """The offload key of a derived (``segments``) block id: the hash is
    ``b"D"`` and the id in 8 big-endian bytes; group 0."""
    return make_offload_key(b"D" + block_id.to_bytes(8, "big"), 0)


class _ChainCompiler:
    """Interns blocks of records into dense ids, checking chain consistency."""

    def __init__(self) -> None:
        # (parent id or -1, stream name) -> ids of that stream's blocks there
        self._streams: dict[tuple[int, str], list[int]] = {}
        # explicit key -> id, and id -> parent id (-1 for a chain head)
        self._explicit: dict[str, int] = {}
        self._parent: dict[int, int] = {}
        self.block_keys: list[OffloadKey] = []

    def _new_block(self, key: OffloadKey) -> int:
        self.block_keys.append(key)
        return len(self.block_keys) - 1

    def compile(self, record: RequestRecord, line: int) -> tuple[int, ...]:
        if record.keys is not None:
            return self._compile_keys(record.keys, line)
        chain: list[int] = []
        parent = -1
        for name, count in record.segments:
            if count <= 0:
                raise TraceFormatError(
                    f"segment {name!r} has {count} blocks; need at least 1", line
                )
            ids = self._streams.setdefault((parent, name), [])
            while len(ids) < count:
                ids.append(self._new_block(block_key(len(self.block_keys))))
            chain.extend(ids[:count])
            parent = ids[count - 1]
        if not chain:
            raise TraceFormatError("request has no blocks", line)
        return tuple(chain)

    def _compile_keys(self, keys: Sequence[str], line: int) -> tuple[int, ...]:
        if not keys:
            raise TraceFormatError("request has no blocks", line)
        chain: list[int] = []
        parent = -1
        seen: set[int] = set()
        for text in keys:
            block = self._explicit.get(text)
            if block is None:
                block = self._new_block(_explicit_key(text, line))
                self._explicit[text] = block
                self._parent[block] = parent
            elif self._parent[block] != parent or block in seen:
                raise TraceFormatError(
                    f"key {text!r} follows a different prefix than where it first "
                    "appeared; keys must be chain hashes (one prefix per key)",
                    line,
                )
            seen.add(block)
            chain.append(block)
            parent = block
        return tuple(chain)


def _explicit_key(text: str, line: int) -> OffloadKey:
    if text.startswith("#"):
        # an integer id from the JSON file: opaque, kept apart from hex hashes
        return make_offload_key(b"#" + text[1:].encode(), 0)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise TraceFormatError(f"key {text!r} is not a hex string", line) from None
    if not raw:
        raise TraceFormatError("empty key", line)
    return make_offload_key(raw, 0)


def compile_trace(records: Iterable[RequestRecord], name: str = "trace") -> Trace:
    """Compile request records into a :class:`Trace`.

    Raises :class:`TraceFormatError` for an empty request, a segment of
    fewer than one block, a key that is not hex, or keys that are not
    consistent chain hashes.
    """
    compiler = _ChainCompiler()
    req_ids: list[str] = []
    chains: list[tuple[int, ...]] = []
    refs = 0
    for index, record in enumerate(records, start=1):
        asked = len(record.keys) if record.keys is not None else sum(
            count for _, count in record.segments
        )
        refs += asked
        if refs > MAX_TRACE_BLOCKS:
            raise TraceFormatError(
                f"the trace asks for more than {MAX_TRACE_BLOCKS} block references",
                record.line or index,
            )
        chains.append(compiler.compile(record, record.line or index))
        req_ids.append(record.req_id)
    return Trace(name, tuple(req_ids), tuple(chains), tuple(compiler.block_keys))


# --- reading and writing --------------------------------------------------


def _parse_record(obj: object, line: int) -> RequestRecord:
    if not isinstance(obj, dict):
        raise TraceFormatError("a request must be a JSON object", line)
    req_id = obj.get("id", f"line-{line}")
    if not isinstance(req_id, (str, int)) or isinstance(req_id, bool):
        raise TraceFormatError("'id' must be a string or an integer", line)
    has_keys, has_segments = "keys" in obj, "segments" in obj
    if has_keys == has_segments:
        raise TraceFormatError("a request needs exactly one of 'keys' or 'segments'", line)
    if has_keys:
        raw_keys = obj["keys"]
        if not isinstance(raw_keys, list):
            raise TraceFormatError("'keys' must be a list", line)
        keys: list[str] = []
        for key in raw_keys:
            if isinstance(key, str):
                if key.startswith("#"):
                    raise TraceFormatError(f"key {key!r} is not a hex string", line)
                keys.append(key.lower())
            elif isinstance(key, int) and not isinstance(key, bool):
                keys.append(f"#{key}")
            else:
                raise TraceFormatError(
                    f"a key must be a hex string or an integer, got {key!r}", line
                )
        if len(keys) > MAX_REQUEST_BLOCKS:
            raise TraceFormatError(
                f"a request has {len(keys)} keys; at most {MAX_REQUEST_BLOCKS}", line
            )
        return RequestRecord(str(req_id), keys=tuple(keys), line=line)
    raw_segments = obj["segments"]
    if not isinstance(raw_segments, list):
        raise TraceFormatError("'segments' must be a list", line)
    segments: list[tuple[str, int]] = []
    for segment in raw_segments:
        if (
            not isinstance(segment, list)
            or len(segment) != 2
            or not isinstance(segment[0], str)
            or not isinstance(segment[1], int)
            or isinstance(segment[1], bool)
        ):
            raise TraceFormatError(
                f"a segment must be [stream name, block count], got {segment!r}", line
            )
        segments.append((segment[0], segment[1]))
    total = sum(count for _, count in segments)
    if total > MAX_REQUEST_BLOCKS:
        raise TraceFormatError(
            f"a request asks for {total} blocks; at most {MAX_REQUEST_BLOCKS}", line
        )
    return RequestRecord(str(req_id), segments=tuple(segments), line=line)


def parse_trace_lines(lines: Iterable[str]) -> Iterator[RequestRecord]:
    """Request records from the lines of a trace file (header skipped).

    Raises :class:`TraceFormatError` on malformed JSON or records, and on a
    header of an unsupported version.
    """
    line_no = 0
    iterator = iter(lines)
    while True:
        try:
            text = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError as error:
            raise TraceFormatError(f"not UTF-8: {error.reason}", line_no + 1) from None
        line_no += 1
        if len(text) > MAX_LINE_CHARS:
            raise TraceFormatError(f"line longer than {MAX_LINE_CHARS} characters", line_no)
        text = text.strip()
        if not text or text.startswith("#"):
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            raise TraceFormatError(f"not JSON: {error.msg}", line_no) from None
        except RecursionError:
            raise TraceFormatError("JSON nested too deeply", line_no) from None
        if isinstance(obj, dict) and "kvoffload_trace" in obj:
            if obj["kvoffload_trace"] != TRACE_FORMAT_VERSION:
                raise TraceFormatError(
                    f"unsupported trace version {obj['kvoffload_trace']!r}", line_no
                )
            continue
        yield _parse_record(obj, line_no)


def load_trace(path: str | Path) -> Trace:
    """Read and compile the trace file at ``path``.

    Raises :class:`TraceFormatError` (also for a file with no request) and
    :class:`OSError` when the file cannot be read.
    """
    path = Path(path)
    with path.open(encoding="utf-8") as stream:
        trace = compile_trace(parse_trace_lines(stream), name=path.stem)
    if trace.num_requests == 0:
        raise TraceFormatError(f"{path} holds no request")
    return trace


def write_trace(
    records: Iterable[RequestRecord],
    stream: IO[str],
    header: dict[str, object] | None = None,
) -> int:
    """Write ``records`` (after a header line) to ``stream``; returns the
    number of requests written."""
    head: dict[str, object] = {"kvoffload_trace": TRACE_FORMAT_VERSION}
    head.update(header or {})
    stream.write(json.dumps(head) + "\n")
    count = 0
    for record in records:
        stream.write(record.to_json() + "\n")
        count += 1
    return count


# --- generators -----------------------------------------------------------


def _zipf_cum_weights(n: int, exponent: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (rank**exponent) for rank in range(1, n + 1)))


def _pick(rng: random.Random, cum_weights: Sequence[float]) -> int:
    """Index drawn with the given cumulative weights (deterministic)."""
    return bisect.bisect_right(cum_weights, rng.random() * cum_weights[-1])


def shared_prompts(
    num_requests: int,
    seed: int = 0,
    num_prompts: int = 32,
    prompt_blocks: tuple[int, int] = (16, 96),
    message_blocks: tuple[int, int] = (1, 6),
    zipf_exponent: float = 1.0,
) -> Iterator[RequestRecord]:
    """Requests that open with one of ``num_prompts`` system prompts (Zipf
    popularity) and end with a unique user message."""
    rng = random.Random(seed)
    lengths = [rng.randint(*prompt_blocks) for _ in range(num_prompts)]
    cum = _zipf_cum_weights(num_prompts, zipf_exponent)
    for index in range(num_requests):
        prompt = _pick(rng, cum)
        yield RequestRecord(
            f"req-{index}",
            segments=(
                (f"system-{prompt}", lengths[prompt]),
                (f"message-{index}", rng.randint(*message_blocks)),
            ),
        )


def multi_turn(
    num_requests: int,
    seed: int = 0,
    num_prompts: int = 4,
    prompt_blocks: tuple[int, int] = (16, 48),
    first_turn_blocks: tuple[int, int] = (2, 16),
    turn_growth_blocks: tuple[int, int] = (2, 12),
    turns: tuple[int, int] = (2, 12),
    active_conversations: int = 48,
) -> Iterator[RequestRecord]:
    """Interleaved conversations: each turn's chain is the previous turn's
    chain grown by a user message and the reply before it."""
    rng = random.Random(seed)
    lengths = [rng.randint(*prompt_blocks) for _ in range(num_prompts)]
    next_conversation = 0

    def open_conversation() -> list[int]:
        nonlocal next_conversation
        conversation = next_conversation
        next_conversation += 1
        # [id, prompt, blocks so far, turns left]
        return [
            conversation,
            rng.randrange(num_prompts),
            rng.randint(*first_turn_blocks),
            rng.randint(*turns),
        ]

    active = [open_conversation() for _ in range(active_conversations)]
    for index in range(num_requests):
        slot = rng.randrange(len(active))
        conversation, prompt, blocks, turns_left = active[slot]
        yield RequestRecord(
            f"req-{index}",
            segments=(
                (f"system-{prompt}", lengths[prompt]),
                (f"conv-{conversation}", blocks),
            ),
        )
        if turns_left <= 1:
            active[slot] = open_conversation()
        else:
            active[slot] = [
                conversation,
                prompt,
                blocks + rng.randint(*turn_growth_blocks),
                turns_left - 1,
            ]


def zipf_docs(
    num_requests: int,
    seed: int = 0,
    num_docs: int = 2000,
    doc_blocks: tuple[int, int] = (8, 64),
    question_blocks: tuple[int, int] = (1, 4),
    zipf_exponent: float = 0.9,
) -> Iterator[RequestRecord]:
    """Documents from a large catalogue read with Zipf popularity, each
    followed by a unique question."""
    rng = random.Random(seed)
    lengths = [rng.randint(*doc_blocks) for _ in range(num_docs)]
    # popularity rank is independent of document length
    order = list(range(num_docs))
    rng.shuffle(order)
    cum = _zipf_cum_weights(num_docs, zipf_exponent)
    for index in range(num_requests):
        doc = order[_pick(rng, cum)]
        yield RequestRecord(
            f"req-{index}",
            segments=(
                (f"doc-{doc}", lengths[doc]),
                (f"question-{index}", rng.randint(*question_blocks)),
            ),
        )


def scan(
    num_requests: int,
    seed: int = 0,
    num_hot: int = 64,
    hot_blocks: tuple[int, int] = (8, 32),
    scan_fraction: float = 0.3,
    scan_blocks: tuple[int, int] = (64, 256),
    message_blocks: tuple[int, int] = (1, 4),
) -> Iterator[RequestRecord]:
    """A hot set of ``num_hot`` prefixes, reused uniformly, polluted by long
    one-off scans (documents read once) in ``scan_fraction`` of requests."""
    rng = random.Random(seed)
    lengths = [rng.randint(*hot_blocks) for _ in range(num_hot)]
    for index in range(num_requests):
        if rng.random() < scan_fraction:
            segments: tuple[tuple[str, int], ...] = (
                (f"scan-{index}", rng.randint(*scan_blocks)),
            )
        else:
            hot = rng.randrange(num_hot)
            segments = (
                (f"hot-{hot}", lengths[hot]),
                (f"message-{index}", rng.randint(*message_blocks)),
            )
        yield RequestRecord(f"req-{index}", segments=segments)


def one_off(
    num_requests: int,
    seed: int = 0,
    num_reused: int = 128,
    reused_blocks: tuple[int, int] = (8, 32),
    one_off_fraction: float = 0.8,
    one_off_blocks: tuple[int, int] = (8, 32),
    zipf_exponent: float = 0.8,
) -> Iterator[RequestRecord]:
    """Mostly one-off documents (read once), around ``num_reused`` reused
    prefixes with Zipf popularity; the case a reuse filter is for."""
    rng = random.Random(seed)
    lengths = [rng.randint(*reused_blocks) for _ in range(num_reused)]
    cum = _zipf_cum_weights(num_reused, zipf_exponent)
    for index in range(num_requests):
        if rng.random() < one_off_fraction:
            segments: tuple[tuple[str, int], ...] = (
                (f"once-{index}", rng.randint(*one_off_blocks)),
            )
        else:
            reused = _pick(rng, cum)
            segments = ((f"reused-{reused}", lengths[reused]),)
        yield RequestRecord(f"req-{index}", segments=segments)


def mixed(num_requests: int, seed: int = 0) -> Iterator[RequestRecord]:
    """Multi-turn (50 %), shared-prompt (30 %) and one-off (20 %) requests,
    interleaved; stream names of the three parts never collide."""
    rng = random.Random(seed)
    sources: list[tuple[str, Iterator[RequestRecord]]] = [
        ("mt", multi_turn(num_requests, seed + 1)),
        ("sp", shared_prompts(num_requests, seed + 2)),
        ("oo", one_off(num_requests, seed + 3, one_off_fraction=1.0)),
    ]
    cum = [0.5, 0.8, 1.0]
    for index in range(num_requests):
        tag, source = sources[_pick(rng, cum)]
        record = next(source)
        yield RequestRecord(
            f"req-{index}",
            segments=tuple((f"{tag}/{name}", n) for name, n in record.segments),
        )


Generator = Callable[[int, int], Iterator[RequestRecord]]


@attrs.frozen
class Workload:
    """A named, seeded generator of request records."""

    name: str
    generate: Generator
    description: str
    default_requests: int


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("shared-prompts", shared_prompts, "Zipf-popular system prompts + unique user messages", 4000),
        Workload("multi-turn", multi_turn, "interleaved conversations growing turn by turn", 4000),
        Workload("zipf-docs", zipf_docs, "large document catalogue with Zipf popularity", 4000),
        Workload("scan", scan, "hot reused prefixes polluted by long one-off scans", 4000),
        Workload("one-off", one_off, "mostly one-off documents around a small reused set", 4000),
        Workload("mixed", mixed, "multi-turn, shared prompts and one-offs interleaved", 4000),
    )
}


def generate_records(
    name: str, num_requests: int | None = None, seed: int = 0
) -> Iterator[RequestRecord]:
    """Records of the built-in workload ``name``.

    Raises :class:`ConfigurationError` for an unknown name or a request count
    below 1.
    """
    workload = WORKLOADS.get(name)
    if workload is None:
        raise ConfigurationError(
            f"unknown workload {name!r}; built-in: {', '.join(WORKLOADS)}"
        )
    count = workload.default_requests if num_requests is None else num_requests
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigurationError(f"number of requests must be >= 1, got {count!r}")
    return workload.generate(count, seed)


def generate_trace(name: str, num_requests: int | None = None, seed: int = 0) -> Trace:
    """The compiled trace of built-in workload ``name`` (see :func:`generate_records`)."""
    return compile_trace(generate_records(name, num_requests, seed), name=name)


__all__ = [
    "TRACE_FORMAT_VERSION",
    "WORKLOADS",
    "RequestRecord",
    "Trace",
    "TraceFormatError",
    "Workload",
    "block_key",
    "compile_trace",
    "generate_records",
    "generate_trace",
    "load_trace",
    "mixed",
    "multi_turn",
    "one_off",
    "parse_trace_lines",
    "scan",
    "shared_prompts",
    "write_trace",
    "zipf_docs",
]
