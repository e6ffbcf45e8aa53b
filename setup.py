"""Build script: the scheduler-side hot path compiled with mypyc, and the
file tier's chunk I/O in C (kvoffload/impl/_chunkio.c).

All metadata lives in pyproject.toml; this file only decides which modules
are compiled (the list in kvoffload/impl/build.py, and C_EXTENSIONS below)
and when the build falls back to pure Python:

- ``KVOFFLOAD_PURE=1`` in the environment: nothing is compiled;
- an editable install (``pip install -e .``): nothing is compiled, so edits
  to the sources take effect, and the install is a static path entry (strict
  editable mode) that type checkers follow;
- mypyc or the C compiler fails (e.g. no compiler on the machine): a
  warning, then the pure-Python wheel (``KVOFFLOAD_REQUIRE_COMPILED=1``
  makes that an error instead, as CI does).

The pure build is the same sources, imported as plain Python; both builds
are tested.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).resolve().parent

# Kept in step with kvoffload/impl/build.py (COMPILED_MODULES); a test checks it.
COMPILED_MODULES = (
    "kvoffload/impl/backend.py",
    "kvoffload/impl/block.py",
    "kvoffload/impl/manager.py",
    "kvoffload/impl/policies.py",
    "kvoffload/impl/recency.py",
    "kvoffload/impl/reuse.py",
    "kvoffload/impl/specs.py",
)


def _warn(message: str) -> None:
    print(f"kvoffload build: {message}", file=sys.stderr)


def _fall_back(message: str) -> None:
    """Say why the build is pure Python, or fail if a compiled one is required."""
    if os.environ.get("KVOFFLOAD_REQUIRE_COMPILED", "").strip() not in ("", "0"):
        raise SystemExit(f"kvoffload build: {message} (KVOFFLOAD_REQUIRE_COMPILED is set)")
    _warn(f"{message}: building the pure-Python package")


def _want_compiled() -> bool:
    if os.environ.get("KVOFFLOAD_PURE", "").strip() not in ("", "0"):
        _warn("KVOFFLOAD_PURE is set: building the pure-Python package")
        return False
    if "editable_wheel" in sys.argv or "develop" in sys.argv:
        _warn("editable install: pure Python (nothing is compiled)")
        return False
    # metadata-only steps (egg_info, dist_info, sdist) need no compilation
    return any(command in sys.argv for command in _BUILDING_COMMANDS)


_BUILDING_COMMANDS = ("bdist_wheel", "build", "build_ext", "install")


def _mypyc_extensions() -> list[object]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        _fall_back("mypyc is not available")
        return []
    try:
        return list(
            mypycify(
                [
                    "--always-true=MYPYC_BUILD",
                    "--config-file=",
                    # only the compiled modules' own errors count; numpy and
                    # torch need not be in the build environment
                    "--ignore-missing-imports",
                    "--follow-imports=silent",
                    "--python-version",
                    f"{sys.version_info.major}.{sys.version_info.minor}",
                    *COMPILED_MODULES,
                ],
                opt_level=os.environ.get("KVOFFLOAD_MYPYC_OPT_LEVEL", "3"),
                group_name="kvoffload_impl",
            )
        )
    except BaseException as error:  # mypyc reports type errors via SystemExit
        if isinstance(error, KeyboardInterrupt):
            raise
        traceback.print_exc()
        _fall_back(f"mypyc failed ({error!r})")
        return []


# The file tier's chunk I/O in C (the interpreter lock released once per
# batch): POSIX system calls, so POSIX only; fs_tier.py falls back to Python.
C_EXTENSIONS = (("kvoffload.impl._chunkio", "kvoffload/impl/_chunkio.c"),)


def _c_extensions() -> list[object]:
    if os.name != "posix":
        return []
    return [Extension(name, [source]) for name, source in C_EXTENSIONS]


def _extensions() -> list[object]:
    if not _want_compiled():
        return []
    return _mypyc_extensions() + _c_extensions()


class BuildExtOrFallBack(build_ext):
    """Compile the extensions; if that fails, drop them (pure Python)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:
            self._drop_outputs()
            _fall_back(f"compiling failed ({error})")

    def _drop_outputs(self) -> None:
        for ext in self.extensions:
            path = Path(self.get_ext_fullpath(ext.name))
            if path.exists():
                path.unlink()
        self.extensions = []
        self.distribution.ext_modules = []

    def get_outputs(self) -> list[str]:
        return [path for path in super().get_outputs() if Path(path).exists()]


class StrictEditable(editable_wheel):
    """Editable installs default to setuptools' strict mode: a static path
    entry to a tree of links, which mypy and other tools can follow (the
    default import hook is invisible to them)."""

    def finalize_options(self) -> None:
        if not self.mode:
            self.mode = "strict"
        super().finalize_options()


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildExtOrFallBack, "editable_wheel": StrictEditable},
)
