"""FM-8's lesson: what the lab adds to ``fm8_backend_outage`` to teach and prove it (DESIGN.md §10)."""
