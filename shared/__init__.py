"""Shared building blocks of reliable-celery-lab.

One concern per module: settings (URLs, names), envelope (``Result`` and
``@enveloped``), faults, scenarios, observe (Redis observations), pipeline (the
task bodies), recipe (how an FM file turns into a Celery app), pool (the prefork
pool the lab runs), the fixes (dlq, claim, retry, timeouts), waiting, runner,
checks, services and harness; and what shows a run: timeline (the model),
timeline_text and progress (the console), report and swimlanes (the HTML).
"""
