"""Presentation: ``timeline`` (the model of a run), ``timeline_text`` and ``progress``
(the console), ``report`` and ``swimlanes`` (the HTML), ``diff`` (each FM's change)."""
