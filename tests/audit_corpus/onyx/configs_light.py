"""backend/onyx/background/celery/configs/light.py at a7d66a8b, with the values it takes from configs/base.py
and onyx/configs/app_configs.py (the environment's defaults)."""

from __future__ import annotations

import os

_REDIS_HOST = os.environ.get("REDIS_HOST") or "localhost"  # app_configs.py:876; base.py:111 builds the URL
_REDIS_PORT = int(os.environ.get("REDIS_PORT", 6379))  # app_configs.py:877

broker_url = f"redis://{_REDIS_HOST}:{_REDIS_PORT}/15"  # base.py:111 (REDIS_DB_NUMBER_CELERY, app_configs.py:980)
broker_connection_retry_on_startup = True  # base.py:113
broker_pool_limit = int(os.environ.get("CELERY_BROKER_POOL_LIMIT", 10))  # base.py:114, app_configs.py:1028-1031
broker_transport_options = {  # base.py:118-126 (priority steps, separator; the socket options left out)
    "priority_steps": list(range(3)),
    "sep": ":",
    "queue_order_strategy": "priority",
    "retry_on_timeout": True,
}
result_backend = f"redis://{_REDIS_HOST}:{_REDIS_PORT}/14"  # base.py:151 (app_configs.py:977-979)
result_expires = int(os.environ.get("CELERY_RESULT_EXPIRES", 86400))  # base.py:152, app_configs.py:1016
task_acks_late = True  # base.py:141, light.py:23
worker_concurrency = int(os.environ.get("CELERY_WORKER_LIGHT_CONCURRENCY", 24))  # light.py:25, app_configs.py:1036-1045
worker_pool = "threads"  # light.py:26
worker_prefetch_multiplier = int(os.environ.get("CELERY_WORKER_LIGHT_PREFETCH_MULTIPLIER", 8))  # light.py:27, :1047-1057
