"""Benchmarks shipped with the package (``guidedec bench ...``).

- :mod:`~guidedec.bench.compliance`: per backend, compile coverage, false positives/negatives on
  test instances, guided-generation compliance and mask times over JSONSchemaBench /
  JSON-Schema-Test-Suite data.
"""
