"""Case studies: published Celery pipelines run in the lab, as written and as fixed (DESIGN.md section 7)."""
