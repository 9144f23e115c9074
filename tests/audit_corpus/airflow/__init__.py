"""Apache Airflow's Celery executor (https://github.com/apache/airflow; default_celery.py at commit
00564358428ed1e7f07d65a99a6063744d948fec, celery_executor_utils.py at 00ba386294c874d62868dad6cfa1d6be6b51a5bb).

A settings dict given to Celery() as config_source, every value from Airflow's configuration (the
environment, AIRFLOW__CELERY__...) with a fallback; Redis broker by default with a 24-hour visibility
timeout, acks late, results in a database, the prefork pool, one plain task. No chord.
Held out: its expectations were written before the audit was run on it.
"""
