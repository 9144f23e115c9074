"""FM-4's lesson: what the lab adds to ``fm4_duplicated_runs`` to teach and prove it (DESIGN.md §10)."""
