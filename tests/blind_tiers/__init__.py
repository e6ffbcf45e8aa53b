"""A blind corpus of secondary tiers (vLLM 0.33's ``SecondaryTierManager``
shape): correct tiers and tiers with one realistic defect each, listed in
:mod:`tests.blind_tiers.manifest`, each defect proven by a kit-free scenario
in ``test_scenarios.py``."""
