"""BookWyrm (https://github.com/bookwyrm-social/bookwyrm, commit db40a61c9eaa6872607ca499b91893914dc1c8cf).

The worker's app (celerywyrm) reads Django settings with the CELERY_ namespace, two of them under
names the namespace does not map (CELERY_DEFAULT_QUEUE, CELERY_CREATE_MISSING_QUEUES), values read
from the environment, Redis as broker and result backend, the prefork pool. The tasks are declared on
a second app (bookwyrm.tasks.app, broker and backend only) and shared, so the worker runs them. No chord.
"""
