"""FM-7's lesson: what the lab adds to ``fm7_rolling_deploys`` to teach and prove it (DESIGN.md §10)."""
