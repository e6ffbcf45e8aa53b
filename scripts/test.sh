#!/usr/bin/env bash
# Set up (idempotent) and run the tests.
#
#   bash scripts/test.sh            the pure-Python build (editable install):
#                                   the whole suite, then mypy --strict
#   bash scripts/test.sh compiled   the compiled build (`pip install .`, mypyc):
#                                   the manager, kit and bench suites against
#                                   the installed wheel, then back to editable
#
# Exit status: pytest's (5 = no tests collected), else mypy's, else ruff's;
# 2 when the set-up fails. TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu installs
# PyTorch's CPU build first (from the public index torch==2.13.0 is the CUDA
# build).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"

if [ -n "${TORCH_INDEX_URL:-}" ]; then
    python -m pip install --quiet torch==2.13.0 --index-url "$TORCH_INDEX_URL" || exit 2
fi

if [ "${1:-}" = "compiled" ]; then
    echo "== compiled build: pip install . (mypyc; a failed compile is an error here)"
    KVOFFLOAD_REQUIRE_COMPILED=1 python -m pip install --quiet --no-deps \
        --force-reinstall . || exit 2
    # Run from a copy of the tests, so that the installed package (not the
    # source tree on the current directory) is what they import.
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    cp -r tests pyproject.toml "$work"/
    (cd "$work" && env -u PYTHONPATH KVOFFLOAD_EXPECT_BUILD=compiled \
        python -m pytest -q -p no:cacheprovider tests/impl tests/stateful tests/bench)
    status=$?
    echo "== back to the editable (pure) install"
    python -m pip install --quiet --no-deps -e "$ROOT" || exit 2
    exit "$status"
fi

python -m pip install --quiet torch==2.13.0 -e '.[dev,worker,fuzz]' || exit 2
KVOFFLOAD_EXPECT_BUILD=pure python -m pytest -q
status=$?
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
python -m mypy || exit $?
python -m ruff check .
