"""wger (https://github.com/wger-project/wger, commit aaba20184527b018e10f1be576202aa7e7cb4c21).

Django settings with the CELERY_ namespace, broker and backend read from the environment (django-environ),
Redis, plain tasks; its worker is started with --pool=gevent on the command line
(extras/docker/production/celery/start-worker), which configuration does not show. No chord.
Held out: its expectations were written before the audit was run on it.
"""
