"""The audit's corpus: real open-source Celery projects, their Celery configuration written again by hand.

Each package here sets the Celery settings and task options one project sets, with the same values and
in the same way (Django's ``CELERY_`` namespace, a settings module, a settings class, values read from
the environment), and cites the project, commit, file and line each comes from. No project code is
copied: only the names and values Celery reads. Django is not installed here: where a project calls
``config_from_object("django.conf:settings", namespace="CELERY")``, the fixture passes its settings
module by name with the same namespace, which is what Celery reads through Django's settings object.

``expected.py`` holds, per project, every finding an expert expects (must report) and every finding
the audit gave that an expert rejects (must not report), each with a one-line reason;
``tests/test_audit_corpus.py`` runs the audit on each and computes precision and recall.
"""
