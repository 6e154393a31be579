"""The migration engine: pure phase logic driven through ports (no I/O of its own)."""
