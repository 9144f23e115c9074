"""paperless-ngx (https://github.com/paperless-ngx/paperless-ngx, commit b0e0e8a35373a5d9d588a507cb63c79e50a23403).

Django settings with the CELERY_ namespace, values read from the environment, a Redis broker and
result backend, the prefork pool, and a chord (bulk_edit's split and merge: consume_file members,
a delete body).
"""
