"""Case study 2's structured log (``case_studies.logs``): every line carries ``batch_id`` and ``bl_number``
(null for a unit without a B/L); a lab run's lines are ``.lab/<namespace>/events/bl-<run>.jsonl``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from structlog.typing import FilteringBoundLogger

from case_studies import logs
from case_studies.logs import close_event_logs, json_logger, read_json_lines

__all__ = ["LOG_KEYS", "bl_logger", "close_event_logs", "event_log", "event_log_path", "json_logger", "read_events",
           "read_json_lines"]

LOG_KEYS = (*logs.BASE_KEYS, "batch_id", "bl_number")
"""The keys every line of the case study carries."""


def bl_logger(batch_id: str, bl_number: str | None, file: TextIO | None = None, **context: Any) -> FilteringBoundLogger:
    """``json_logger`` bound to one consignment: every line carries ``batch_id`` and ``bl_number``."""
    return json_logger(file, batch_id=batch_id, bl_number=bl_number, **context)


def event_log_path(run_id: str, folder: Path | None = None) -> Path:
    return logs.event_log_path("bl", run_id, folder)


def event_log(run_id: str, folder: Path | None = None) -> FilteringBoundLogger:
    return logs.event_log("bl", run_id, folder)


def read_events(run_id: str, folder: Path | None = None) -> list[dict[str, Any]]:
    return logs.read_events("bl", run_id, folder)
