#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: pytest, then mypy --strict.
# Exit status: pytest's (5 = no tests collected), else mypy's.
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet torch==2.13.0 -e '.[dev,worker]' || exit 2
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" python -m pytest -q
status=$?
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
python -m mypy
