"""The daemon's logs: one line per event, as text or as JSON (--log-format).

Events carry their context as ``extra`` fields (event, client, session,
request_id, code, ...): the text format appends them as key=value, the JSON
format makes each a key of the line's object.  Nothing is logged per step;
sessions opening, closing and expiring, and every error reply, are.
"""
from __future__ import annotations

import json
import logging
import time

#: LogRecord attributes that are not event fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def event_fields(record: logging.LogRecord) -> dict:
    """The extra fields an event was logged with, in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s envd[%(process)d] %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = event_fields(record)
        return line + "".join(f" {k}={v}" for k, v in fields.items()) if fields else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, pid,
    message, the event's fields, and the traceback of an exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                 + f".{int(record.msecs):03d}Z",
                 "level": record.levelname.lower(), "logger": record.name,
                 "pid": record.process, "message": record.getMessage(),
                 **event_fields(record)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, log_format: str) -> None:
    """Log to stderr at level, in log_format ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
