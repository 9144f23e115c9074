"""The lab's audit of a user's own Celery app (issue 25, DESIGN.md §8; docs/audit.md).

``reliable-celery-audit myproject.celery:app`` (or ``python -m audit``) imports the app with no
connection allowed (``audit.guard``), reads its settings, queues, routes and every task's options
(``audit.facts``), checks them against the rules the lab proves (``audit.rules``) and prints a
table, JSON or SARIF (``audit.output``; the command is ``audit.cli``).
"""
