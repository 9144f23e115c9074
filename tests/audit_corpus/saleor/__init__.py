"""Saleor (https://github.com/saleor/saleor, commit 723cd4eba87dfc72822ade45dc08a3caa548428d).

Django settings with the CELERY_ namespace, the broker read from the environment (CELERY_BROKER_URL or
CloudAMQP's CLOUDAMQP_URL: RabbitMQ; unset, Celery's default amqp://), no result backend unless the
environment names one, the prefork pool, retries given with retry_kwargs={"max_retries": 5}. No chord.
"""
