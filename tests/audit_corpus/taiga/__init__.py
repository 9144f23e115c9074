"""Taiga (https://github.com/taigaio/taiga-back, commit 3bea7114007afd83478a8d6f2a70afd70d94dc21).

Django settings with the CELERY_ namespace, RabbitMQ, no result backend, a topic default exchange,
queues given under a name the namespace does not map (CELERY_QUEUES), the prefork pool. No chord.
"""
