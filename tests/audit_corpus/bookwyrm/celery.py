"""celerywyrm/celery.py at db40a61c: the worker's app (line 13) and the namespace (line 19); autodiscovery
(line 22) finds bookwyrm's task modules."""

from __future__ import annotations

from celery import Celery

app = Celery("celerywyrm")
app.config_from_object("tests.audit_corpus.bookwyrm.settings", namespace="CELERY")
app.conf.include = ["tests.audit_corpus.bookwyrm.activitystreams"]
