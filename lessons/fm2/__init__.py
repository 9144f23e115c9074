"""FM-2's lesson: what the lab adds to ``fm2_worker_crash`` to teach and prove it (DESIGN.md §10)."""
