"""The files here are torch-semiring-einsum's tests; tests/test_semiring_einsum_suite.py runs them in a
subprocess (their import rewritten), so pytest does not collect them from here."""

collect_ignore_glob = ["*.py"]
