"""Benchmarks behind ``shadowpod bench``. They print figures (JSON with ``--json``);
targets are reported, not asserted by timed unit tests."""
