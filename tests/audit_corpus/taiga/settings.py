"""Taiga's Celery settings (settings/common.py at 3bea7114)."""

from __future__ import annotations

from kombu import Queue

CELERY_BROKER_URL = "amqp://guest:guest@localhost:5672//"  # common.py:51
CELERY_RESULT_BACKEND = None  # common.py:52
CELERY_ACCEPT_CONTENT = ["pickle"]  # :53
CELERY_TASK_SERIALIZER = "pickle"  # :54
CELERY_RESULT_SERIALIZER = "pickle"  # :55
CELERY_TIMEZONE = "Europe/Madrid"  # :56
CELERY_TASK_DEFAULT_QUEUE = "tasks"  # :57
CELERY_QUEUES = (Queue("tasks", routing_key="task.#"), Queue("transient", routing_key="transient.#", delivery_mode=1))  # :58-61
CELERY_TASK_DEFAULT_EXCHANGE = "tasks"  # :62
CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"  # :63
CELERY_TASK_DEFAULT_ROUTING_KEY = "task.default"  # :64
