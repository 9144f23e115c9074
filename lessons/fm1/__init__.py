"""FM-1's lesson: what the lab adds to ``fm1_mid_pipeline_error`` to teach and prove it (DESIGN.md §10)."""
