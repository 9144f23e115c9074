"""wger's Celery settings (settings/main.py at aaba2018), env.str as os.environ with the same defaults."""

from __future__ import annotations

import os

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER", "redis://cache:6379/2")  # main.py:313
CELERY_RESULT_BACKEND = os.environ.get("CELERY_BACKEND", "redis://cache:6379/2")  # main.py:314
