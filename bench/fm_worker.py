"""The Celery app a benchmark worker serves: ``celery -A bench.fm_worker worker ...``.

Knobs (environment, read at import): ``RCL_BENCH_FM``, the program's module (``fm0_naive``,
``fm9_connection_loss``, ``bench.fm9_chunked``); ``RCL_BENCH_OBSERVER=off``, the lab's observer
disconnected from Celery's signals (``lab.observe.uninstall``) once the program is imported:
the FM's own code alone, as production runs it. ``bench/bench_chord.py`` sets both.
"""

from __future__ import annotations

import importlib
import os
from typing import cast

from celery import Celery

from lab import observe

PROGRAM = os.environ.get("RCL_BENCH_FM", "fm7_rolling_deploys")
OBSERVER = os.environ.get("RCL_BENCH_OBSERVER", "on")

app = cast(Celery, importlib.import_module(PROGRAM).app)
if OBSERVER == "off":
    observe.uninstall()
