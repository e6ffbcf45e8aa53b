"""Which build of the scheduler-side modules is running, and the argument
types of their public calls.

The wheel that ``pip install .`` builds compiles :data:`COMPILED_MODULES`
with mypyc; the same sources also run as plain Python (``KVOFFLOAD_PURE=1``,
an editable install, or a machine where compilation failed). Both builds
behave alike; :func:`build_name` says which one is imported.

A compiled function checks each argument against its annotation before its
body runs and raises ``TypeError`` (``True`` even passes as the int 1). The
public calls validate their input themselves and raise the documented
:class:`~kvoffload.spec.errors.OffloadingError` subclasses, so their
parameters are annotated with the aliases below: for a type checker they are
the plain types (``int``, ``str``, ``bool``, :data:`OffloadKey`); for mypyc,
which is run with ``--always-true MYPYC_BUILD``, they are ``object``, so the
value reaches the function's own checks unchanged.
"""

from __future__ import annotations

import importlib

from kvoffload.spec.keys import OffloadKey

MYPYC_BUILD = False
"""True only while mypyc compiles these modules (``--always-true MYPYC_BUILD``)."""

COMPILED_MODULES = (
    "kvoffload.impl.backend",
    "kvoffload.impl.block",
    "kvoffload.impl.manager",
    "kvoffload.impl.policies",
    "kvoffload.impl.recency",
    "kvoffload.impl.reuse",
    "kvoffload.impl.specs",
)
"""The modules the compiled build compiles (the scheduler's hot path)."""

if not MYPYC_BUILD:
    IntArg = int
    StrArg = str
    BoolArg = bool
    KeyArg = OffloadKey
else:
    IntArg = object  # type: ignore[misc, assignment]
    StrArg = object  # type: ignore[misc, assignment]
    BoolArg = object  # type: ignore[misc, assignment]
    KeyArg = object  # type: ignore[misc, assignment]


def compiled_modules() -> list[str]:
    """The modules of :data:`COMPILED_MODULES` imported from a compiled
    extension (empty in the pure-Python build)."""
    compiled = []
    for name in COMPILED_MODULES:
        origin = getattr(importlib.import_module(name), "__file__", None) or ""
        if not origin.endswith(".py"):
            compiled.append(name)
    return compiled


def build_name() -> str:
    """``"compiled"`` when every hot-path module is compiled, ``"pure"`` when
    none is, ``"mixed"`` otherwise."""
    count = len(compiled_modules())
    if count == len(COMPILED_MODULES):
        return "compiled"
    return "pure" if count == 0 else "mixed"


__all__ = [
    "COMPILED_MODULES",
    "MYPYC_BUILD",
    "BoolArg",
    "IntArg",
    "KeyArg",
    "StrArg",
    "build_name",
    "compiled_modules",
]
