"""Two of the light worker's tasks at a7d66a8b (backend/onyx/background/celery/tasks/vespa/tasks.py), options only."""

from __future__ import annotations

import os
from typing import Any

from celery import shared_task

JOB_TIMEOUT = int(os.environ.get("JOB_TIMEOUT_SECONDS") or 60 * 60 * 6)  # onyx/configs/app_configs.py:1674
LIGHT_SOFT_TIME_LIMIT = 105  # tasks/shared/tasks.py:45
LIGHT_TIME_LIMIT = LIGHT_SOFT_TIME_LIMIT + 15  # tasks/shared/tasks.py:46


@shared_task(name="check_for_vespa_sync_task", ignore_result=True, soft_time_limit=JOB_TIMEOUT,
             bind=True)  # vespa/tasks.py:88-94
def check_for_vespa_sync_task(self: Any, *, tenant_id: str) -> bool | None: ...


@shared_task(name="document_index_metadata_sync_task", bind=True, soft_time_limit=LIGHT_SOFT_TIME_LIMIT,
             time_limit=LIGHT_TIME_LIMIT, max_retries=3)  # vespa/tasks.py:465-471
def document_index_metadata_sync_task(self: Any, document_id: str, *, tenant_id: str) -> bool: ...
