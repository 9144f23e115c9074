"""DefectDojo (https://github.com/DefectDojo/django-DefectDojo, commit 7cfa159a6767b0ac6e66f3b1597a997e607e7308).

Django settings with the CELERY_ namespace, every value read from the environment (django-environ,
with defaults), the Redis broker its docker-compose.yml gives, results in the Django database, a
12-hour time limit, and CELERY_TASK_DEFAULT_EXPIRES, which Celery has never had. No chord.
"""
