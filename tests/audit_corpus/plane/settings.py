"""Plane's Celery settings (apps/api/plane/settings/common.py at 4ca6d6c7)."""

from __future__ import annotations

import os

RABBITMQ_HOST = os.environ.get("RABBITMQ_HOST", "localhost")  # common.py:299
RABBITMQ_PORT = os.environ.get("RABBITMQ_PORT", "5672")  # :300
RABBITMQ_USER = os.environ.get("RABBITMQ_USER", "guest")  # :301
RABBITMQ_PASSWORD = os.environ.get("RABBITMQ_PASSWORD", "guest")  # :302
RABBITMQ_VHOST = os.environ.get("RABBITMQ_VHOST", "/")  # :303
AMQP_URL = os.environ.get("AMQP_URL")  # :304

CELERY_BROKER_URL = AMQP_URL or (  # :307-310 (an if/else there)
    f"amqp://{RABBITMQ_USER}:{RABBITMQ_PASSWORD}@{RABBITMQ_HOST}:{RABBITMQ_PORT}/{RABBITMQ_VHOST}")

CELERY_TIMEZONE = "UTC"  # :312
CELERY_TASK_SERIALIZER = "json"  # :313
CELERY_RESULT_SERIALIZER = "json"  # :314
CELERY_ACCEPT_CONTENT = ["application/json"]  # :315
CELERY_IMPORTS = ("tests.audit_corpus.plane.bgtasks",)  # :318-330 lists plane.bgtasks modules
