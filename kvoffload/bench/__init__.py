"""Benchmarks: ``python -m kvoffload bench manager`` (scheduler-side
managers) and ``bench transfer`` (worker side). Timings are printed, never
asserted."""
