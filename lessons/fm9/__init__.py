"""FM-9's lesson: what the lab adds to ``fm9_connection_loss`` to teach and prove it (DESIGN.md §10)."""
