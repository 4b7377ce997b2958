"""Mutants per engine: each module has ``SUITES`` and ``mutants()``."""
