"""One JSON object per line: the structured decision logs of the case studies (structlog).

Every line holds ``timestamp`` (ISO 8601, UTC), ``level``, ``event`` (the name the
caller logs, ``unit_dead_lettered``) and what is bound or passed. Each case study
says which keys its lines carry (case study 1: ``run_id``; 2: ``batch_id`` and
``bl_number``; 3: ``event_id``, ``lot_code`` and ``supplier``) and checks read the
lines back and assert on keys, never on wording.

- ``json_logger(file=None, **context)``: a logger writing to ``file`` (stderr by
  default, looked up when called, so pytest's capture sees it);
- ``event_log(study, run_id, folder=None)``: a lab run's log of one case study,
  the file ``event_log_path(study, run_id)``
  (``.lab/<namespace>/events/<study>-<run>.jsonl`` unless ``folder`` is given)
  opened for appending: each line is a single ``write`` of the whole line, so the
  worker processes of a run share the file without interleaving lines.
  ``close_event_logs()`` closes this process's handles;
- ``read_json_lines(source)``: the objects of such a file or stream, in order; a
  line that is not a JSON object raises ``ValueError`` naming it;
  ``read_events(study, run_id, folder=None)``: a run's lines.

No global configuration: each logger is built by ``structlog.wrap_logger`` with
its own processors and wrapper class, so ``structlog.configure`` elsewhere does
not change these lines, and nothing here changes anyone else's logging.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, TextIO, cast

import structlog
from structlog.typing import FilteringBoundLogger, Processor

from lab.settings import NAMESPACE

ROOT = Path(__file__).resolve().parent.parent
BASE_KEYS = ("timestamp", "level", "event")
"""The keys every line carries."""

_PROCESSORS: list[Processor] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.format_exc_info,  # log.exception(...): the traceback as a string field
    structlog.processors.JSONRenderer(),
]
_WRAPPER = structlog.make_filtering_bound_logger(logging.DEBUG)
_EVENT_FILES: dict[Path, TextIO] = {}


def json_logger(file: TextIO | None = None, **context: Any) -> FilteringBoundLogger:
    """A logger that writes one JSON object per line to ``file`` (default: ``sys.stderr``), ``context`` bound."""
    logger = structlog.wrap_logger(structlog.WriteLogger(sys.stderr if file is None else file), processors=_PROCESSORS,
                                   wrapper_class=_WRAPPER, context_class=dict, cache_logger_on_first_use=False)
    return cast(FilteringBoundLogger, logger).bind(**context)  # wrap_logger is typed Any: its wrapper is _WRAPPER


def event_log_path(study: str, run_id: str, folder: Path | None = None) -> Path:
    """Where ``event_log(study, run_id, folder)`` writes."""
    return (folder or ROOT / ".lab" / NAMESPACE / "events") / f"{study}-{run_id}.jsonl"


def event_log(study: str, run_id: str, folder: Path | None = None) -> FilteringBoundLogger:
    """The logger of lab run ``run_id`` of ``study`` (stderr for an empty ``run_id``: work outside the lab's runs)."""
    if not run_id:
        return json_logger()
    path = event_log_path(study, run_id, folder)
    file = _EVENT_FILES.get(path)
    if file is None or file.closed:
        path.parent.mkdir(parents=True, exist_ok=True)
        file = _EVENT_FILES[path] = path.open("a", encoding="utf-8")
    return json_logger(file)


def clear_event_logs(study: str, folder: Path | None = None) -> None:
    """Delete the namespace's files of ``study`` (``run_all_fms.py --clean``)."""
    close_event_logs()
    for path in event_log_path(study, "x", folder).parent.glob(f"{study}-*.jsonl"):
        path.unlink(missing_ok=True)


def close_event_logs() -> None:
    """Close the files ``event_log`` opened in this process (the next ``event_log`` opens them again)."""
    while _EVENT_FILES:
        _, file = _EVENT_FILES.popitem()
        file.close()


def read_json_lines(source: Path | str | TextIO) -> list[dict[str, Any]]:
    """The JSON objects of ``source`` (a path or an open text stream), one per non-blank line, in order."""
    if isinstance(source, (str, Path)):
        with Path(source).open(encoding="utf-8") as file:
            return read_json_lines(file)
    name = getattr(source, "name", "<stream>")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            value: object = json.loads(line)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise ValueError(f"{name}:{number}: not a JSON object: {line.strip()[:80]!r}")
        records.append(cast(dict[str, Any], value))
    return records


def read_events(study: str, run_id: str, folder: Path | None = None) -> list[dict[str, Any]]:
    """The lines ``event_log(study, run_id, folder)`` wrote, in order; [] when it wrote none."""
    path = event_log_path(study, run_id, folder)
    return read_json_lines(path) if path.exists() else []
