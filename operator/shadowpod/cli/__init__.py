"""The ``shadowpod`` command line: one CLI for everything (subcommands per area)."""
