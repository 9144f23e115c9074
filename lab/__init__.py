"""The lab's machinery: what makes a run reproducible, observed and checked.

``app`` (the namespaced app every FM file starts from), ``pipeline`` (the teaching
pipeline's business code and its stand-in services), ``faults`` and ``scenarios``,
``observe`` (Celery signals in, a run's record in Redis out), ``fm`` (what the
harness reads off an FM module), ``runner``, ``checks``, ``harness``, ``services``,
``settings``, ``pool``, ``waiting``, ``variants``. What shows a run lives in ``lab.show``.
"""
