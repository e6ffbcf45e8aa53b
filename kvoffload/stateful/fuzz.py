"""HypoFuzz campaigns over the conformance kit's state machine.

`HypoFuzz <https://hypofuzz.com>`_ runs Hypothesis tests for as long as you
let it, guided by coverage, and keeps what it finds in a Hypothesis example
database. Every built-in manager is a fuzz target here, as a
``unittest.TestCase`` named ``Test<target>``::

    pip install 'kvoffload[fuzz]'
    hypothesis fuzz -n 2 --no-dashboard -- --pyargs kvoffload.stateful.fuzz

A team takes fuzzing past one machine by pointing every worker at one
example database: set ``KVOFFLOAD_FUZZ_DB`` to a directory on a shared file
system (or build any other :class:`hypothesis.database.ExampleDatabase` and
pass it to :func:`use_shared_database`). A failure found by one worker is
then replayed first by every other worker and by plain ``pytest`` runs of
the same test.

Your own backend: in a test module of yours::

    from kvoffload.stateful import machine_test_case
    from kvoffload.stateful.fuzz import use_shared_database
    use_shared_database()
    TestMyBackend = machine_test_case(make_manager, policy="any")

then ``hypothesis fuzz -- path/to/that_module.py``.
"""

from __future__ import annotations

import os
import re

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from kvoffload.stateful import machine_test_case
from kvoffload.stateful.targets import BUILTIN_TARGETS

DATABASE_ENV = "KVOFFLOAD_FUZZ_DB"
"""Environment variable naming the directory of the shared example database."""

_PROFILE = "kvoffload-fuzz"


def shared_database() -> ExampleDatabase | None:
    """The example database named by ``KVOFFLOAD_FUZZ_DB``, or None (then
    Hypothesis's default, ``.hypothesis/`` under the working directory)."""
    path = os.environ.get(DATABASE_ENV)
    if not path:
        return None
    return DirectoryBasedExampleDatabase(path)


def use_shared_database(database: ExampleDatabase | None = None) -> None:
    """Make Hypothesis's default settings fit for a HypoFuzz campaign.

    HypoFuzz fuzzes only tests that are not derandomized and that use the
    default example database, so this loads a profile, derived from the
    current one, with ``derandomize=False`` and with ``database`` (default:
    :func:`shared_database`; Hypothesis's default when that is None too) as
    the example database. Call it at the top of a fuzz module, before any
    test is defined.
    """
    chosen = database if database is not None else shared_database()
    current = settings.get_profile(settings.get_current_profile_name())
    if chosen is None:
        settings.register_profile(_PROFILE, parent=current, derandomize=False)
    else:
        settings.register_profile(
            _PROFILE, parent=current, derandomize=False, database=chosen
        )
    settings.load_profile(_PROFILE)


def _class_name(target_name: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", target_name)
    return "Test" + "".join(word[:1].upper() + word[1:] for word in words)


use_shared_database()

for _target in BUILTIN_TARGETS:
    globals()[_class_name(_target.name)] = machine_test_case(
        _target.factory,
        policy=_target.policy,
        reuse_filter=_target.reuse_filter,
        profile=_target.audit_profile,
    )
