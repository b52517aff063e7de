"""The files here are torch-struct's tests and the shim they run against; tests/test_torch_struct_suite.py runs
them in a subprocess (with their imports rewritten), so pytest does not collect them from here."""

collect_ignore_glob = ["*.py"]
