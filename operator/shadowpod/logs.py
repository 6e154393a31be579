"""Structured logs: one JSON object per line, with session, migration and epoch when known."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final

import orjson

_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
    # What Kopf attaches to its records for its own use: its whole settings object on
    # every line, and a flag for its event poster.
    | {"settings", "k8s_skip"}
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Fields given with ``extra=`` (session, epoch, migration, ...).
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if isinstance(ref := entry.pop("k8s_ref", None), dict):  # Kopf's object, in short
            entry["object"] = f"{ref.get('kind')}/{ref.get('namespace')}/{ref.get('name')}"
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
