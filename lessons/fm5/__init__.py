"""FM-5's lesson: what the lab adds to ``fm5_transient_failures`` to teach and prove it (DESIGN.md §10)."""
