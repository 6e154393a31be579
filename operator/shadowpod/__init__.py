"""Shadowpod: live migration of long-running AI agent sessions between pods.

The package is organised in rooms that import only downward (see the import-linter
contracts in ``pyproject.toml``):

- ``shadowpod.domain``  — pure models: journal entries, session state, the reducer,
  state schema migrations. No I/O.
- ``shadowpod.journal`` — the session journal store (SQLite and PostgreSQL).
- ``shadowpod.cli``, ``shadowpod.bench`` — command line and benchmarks.
"""

__version__ = "0.1.0"
