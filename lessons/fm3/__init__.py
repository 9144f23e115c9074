"""FM-3's lesson: what the lab adds to ``fm3_dlq_reconciliation`` to teach and prove it (DESIGN.md §10)."""
