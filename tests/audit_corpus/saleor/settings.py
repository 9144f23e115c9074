"""Saleor's Celery settings (saleor/settings.py at 723cd4eb)."""

from __future__ import annotations

import os

CELERY_ACCEPT_CONTENT = ["json"]  # settings.py:624
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", os.environ.get("CLOUDAMQP_URL")) or ""  # :625-627
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", None)  # :634
CELERY_RESULT_SERIALIZER = "json"  # :635
CELERY_TASK_SERIALIZER = "json"  # :637
CELERY_WORKER_PREFETCH_MULTIPLIER = int(os.environ.get("CELERY_WORKER_PREFETCH_MULTIPLIER", 1))  # :639-641
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")  # :1073
AUTOMATIC_CHECKOUT_COMPLETION_QUEUE_NAME = os.environ.get("AUTOMATIC_CHECKOUT_COMPLETION_QUEUE_NAME", None)  # :1110
