"""A blind corpus of offloading managers, written against README.md and
docs/SPEC.md only: correct managers of several designs and defective twins
with one realistic slip each. ``manifest.MANIFEST`` lists them with the audit
options to pass; ``test_corpus_sanity`` shows each defect on a concrete call
sequence and checks the correct ones against the reference managers.
"""
