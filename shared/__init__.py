"""Shared building blocks of reliable-celery-lab.

One concern per module: settings (URLs, names), envelope (``Result`` and
``@enveloped``), faults, scenarios, observe (Redis observations), pipeline (the
task bodies), recipe (how an FM file turns into a Celery app), the fixes
(dlq, claim, retry, timeouts), runner, checks, services and harness.
"""
