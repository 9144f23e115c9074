"""Plane (https://github.com/makeplane/plane, commit 4ca6d6c7b807ad09bb571af2c43e85bf47c3ec6b).

Django settings with the CELERY_ namespace, a RabbitMQ broker built from the environment, no result
backend, Celery's defaults for acks and limits, the prefork pool, plain shared tasks. No chord.
"""
