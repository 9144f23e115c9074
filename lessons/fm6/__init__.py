"""FM-6's lesson: what the lab adds to ``fm6_task_timeouts`` to teach and prove it (DESIGN.md §10)."""
