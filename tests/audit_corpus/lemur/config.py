"""docker/src/lemur.conf.py at 3a3c2c20, the keys Celery reads and two it does not (the Flask config holds both)."""

from __future__ import annotations

import os
from typing import Any

REDIS_HOST = "redis"  # lemur.conf.py:38
REDIS_PORT = 6379  # :39
CELERY_RESULT_BACKEND = f"redis://{REDIS_HOST}:{REDIS_PORT}"  # :41
CELERY_BROKER_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}"  # :42
CELERY_IMPORTS = ("tests.audit_corpus.lemur.tasks",)  # :43 names lemur.common.celery, where the tasks are
CELERYBEAT_SCHEDULE: dict[str, object] = {}  # :44-143, every entry commented out
CELERY_TIMEZONE = "UTC"  # :145
SQLALCHEMY_DATABASE_URI = os.environ.get("SQLALCHEMY_DATABASE_URI", "postgresql://lemur:lemur@localhost:5432/lemur")  # :148
SQLALCHEMY_TRACK_MODIFICATIONS = False  # :150

FLASK_CONFIG: dict[str, Any] = {k: v for k, v in dict(globals()).items() if k.isupper()}
"""What Flask's app.config holds after from_pyfile: every upper-case name of the file."""
