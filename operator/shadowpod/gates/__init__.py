"""Upgrade gates: judge whether a new agent version answers as the old one did.

Pure domain code: answers, judges, policies, golden files. Only ``openai_http`` (the
LLM judge's HTTP adapter) does I/O; ``semantic`` loads a local embedding model.
"""
