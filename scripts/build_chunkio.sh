#!/usr/bin/env bash
# Build the file tier's C I/O (kvoffload/impl/_chunkio.c) into the checkout,
# for runs from a source tree (PYTHONPATH=$PWD, an editable install), which
# otherwise use the Python I/O. `pip install .` builds it into the wheel;
# this is for measuring it without an install (scripts/gpu_check.sh).
# Remove the built file (kvoffload/impl/_chunkio.*.so, git-ignored) to go
# back to the Python I/O; an editable install picks a new file up after
# `pip install --no-deps -e .`.
#
#   bash scripts/build_chunkio.sh        # in the repository root
set -euo pipefail
PY=${PYTHON:-python3}
include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
out="kvoffload/impl/_chunkio$suffix"
${CC:-cc} -O2 -Wall -Wextra -Wno-missing-field-initializers -shared -fPIC \
    -I"$include" kvoffload/impl/_chunkio.c -o "$out"
PYTHONPATH=$PWD "$PY" -c 'from kvoffload.impl import fs_tier; assert fs_tier.COMPILED_IO'
echo "built $out"
