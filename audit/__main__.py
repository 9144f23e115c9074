"""``python -m audit myproject.celery:app``: the same as ``reliable-celery-audit`` (``audit.cli``)."""

from audit.cli import main

raise SystemExit(main())
