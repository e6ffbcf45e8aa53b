"""Research aid: audit a release with the kit's illegal calls set aside.

Every vLLM release fails the audit within a few examples on F3 (an illegal
``prepare_load``/``complete_load`` changes the keys before the bad one),
which hides whatever else the kit would find. This script runs the same
targets and profile as ``python -m kvoffload audit --vllm DIR`` but makes the
kit skip every illegal call (it patches the kit in this process only), and
prints one line per target and seed, with the shrunk calls of each failure.

    python docs/findings/audit_without_illegal_calls.py DIR EXAMPLES SEEDS [TARGET] [-v]

e.g. ``... /tmp/vllm/0.24.0 200 0,1 lru -v`` (``-`` for every target).
"""

import sys

from kvoffload.spec.releases import preset_for_generation
from kvoffload.stateful import harness
from kvoffload.stateful.auditing import audit
from kvoffload.stateful.vllm_targets import release_targets
from kvoffload.vllm_release import load_release

harness.Harness._illegal = lambda self, op, expected: None  # skip illegal calls

release = load_release(sys.argv[1])
examples = int(sys.argv[2])
seeds = [int(seed) for seed in sys.argv[3].split(",")]
only = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
verbose = "-v" in sys.argv[5:]
profile = preset_for_generation(release.generation.value)
for target in release_targets(release):
    if only and only != target.name.split()[0]:
        continue
    for seed in seeds:
        report = audit(
            target.factory,
            policy=target.policy,
            reuse_filter=target.reuse_filter,
            profile=profile,
            max_examples=examples,
            seed=seed,
            name=target.name,
        )
        verdict = "PASS" if report.passed else f"FAIL {report.invariant}: {report.message}"
        print(f"{release.version} {target.name:36} seed={seed} {verdict} {report.seconds:.1f}s",
              flush=True)
        if not report.passed and verbose and report.script:
            calls = ("m.", "m =", "must", "out", "# ^")
            print("\n".join(line for line in report.script.splitlines() if line.startswith(calls)))
