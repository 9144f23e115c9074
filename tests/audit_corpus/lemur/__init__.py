"""Lemur (https://github.com/Netflix/lemur, commit 3a3c2c201d42db0eed06e79297eb8dc252c39288).

A Flask app's whole config dict given to ``celery.conf.update`` (old-style upper-case names among the
app's other keys), a Redis broker and result backend from the docker config, the prefork pool, tasks
bounded by a soft time limit alone. No chord.
"""
