#!/usr/bin/env python3
"""Fetch one vLLM release's scheduler-side offloading code for the kit.

    python scripts/fetch_vllm.py VERSION DEST [-- PIP-OPTIONS...]

runs ``pip download --no-deps vllm==VERSION`` into a temporary directory,
extracts only ``vllm/v1/kv_offload/*``, ``vllm-VERSION.dist-info/METADATA``
and, where the release has it, ``vllm/fs_io_C*.so`` (the C file I/O of
vLLM's fs tier, which ``bench tier`` runs it with) into ``DEST``, and
deletes the wheel. ``DEST`` is then a directory that ``python -m kvoffload
audit --vllm DEST``, ``bench manager --vllm-path DEST`` and ``bench tier
--vllm-path DEST`` accept. Options after ``--`` go to pip (e.g. ``--index-url``).
Exit status 0 on success, 1 when pip fails or the wheel lacks
``vllm/v1/kv_offload``, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

KEEP = re.compile(
    r"^(vllm/v1/kv_offload/.*|vllm-[^/]+\.dist-info/METADATA|vllm/fs_io_C[^/]*\.so)$"
)


def extract(wheel: Path, dest: Path) -> list[str]:
    """Extract the members of ``wheel`` that the kit needs into ``dest``;
    their names."""
    with zipfile.ZipFile(wheel) as archive:
        names = [name for name in archive.namelist() if KEEP.match(name)]
        for name in names:
            archive.extract(name, dest)
    return names


def fetch(version: str, dest: Path, pip_options: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="kvoffload-vllm-") as download:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "-d", download, f"vllm=={version}", *pip_options,
        ]
        print("$", " ".join(command), flush=True)
        if subprocess.run(command, check=False).returncode != 0:
            print(f"fetch_vllm: pip could not download vllm=={version}", file=sys.stderr)
            return 1
        wheels = sorted(Path(download).glob("vllm-*.whl"))
        if not wheels:
            print("fetch_vllm: pip downloaded no vllm wheel", file=sys.stderr)
            return 1
        names = extract(wheels[0], dest)
    if not any(name.startswith("vllm/v1/kv_offload/") for name in names):
        print(f"fetch_vllm: vllm=={version} has no vllm/v1/kv_offload", file=sys.stderr)
        return 1
    print(f"extracted {len(names)} files into {dest} (wheel deleted)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    pip_options: list[str] = []
    if "--" in args_in:
        split = args_in.index("--")
        args_in, pip_options = args_in[:split], args_in[split + 1 :]
    parser = argparse.ArgumentParser(prog="fetch_vllm.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="a vLLM release, e.g. 0.33.0")
    parser.add_argument("dest", type=Path, help="directory to extract into (created)")
    args = parser.parse_args(args_in)
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+\-]*", args.version):
        parser.error(f"not a version: {args.version!r}")
    args.dest.mkdir(parents=True, exist_ok=True)
    return fetch(args.version, args.dest, pip_options)


if __name__ == "__main__":
    sys.exit(main())
