"""Read the Docs' Celery settings as classes (readthedocs/settings/base.py and docker_compose.py at 79371961)."""

from __future__ import annotations


class CommunityBaseSettings:  # base.py:37
    RTD_BUILDS_MAX_RETRIES = 25  # base.py:177
    RTD_BUILDS_RETRY_DELAY = 5 * 60  # base.py:178

    CELERY_APP_NAME = "readthedocs"  # base.py:664
    CELERY_TASK_ALWAYS_EAGER = True  # :665
    CELERY_TASK_TIME_LIMIT = 60 * 60  # :666
    CELERY_TASK_SEND_ERROR_EMAILS = False  # :667, a setting Celery 5 does not have
    CELERY_TASK_IGNORE_RESULT = True  # :668
    CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # :669
    CELERY_TASK_ACKS_LATE = True  # :671
    CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # :673
    CELERY_TASK_CREATE_MISSING_QUEUES = True  # :674
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 18000}  # :678-680
    CELERY_TASK_DEFAULT_QUEUE = "celery"  # :682


class DockerBaseSettings(CommunityBaseSettings):  # docker_compose.py:7
    CELERY_BROKER_URL = "redis://:redispassword@cache:6379/0"  # docker_compose.py:178
    CELERY_TASK_ALWAYS_EAGER = False  # docker_compose.py:180
