"""Onyx (https://github.com/onyx-dot-app/onyx, commit a7d66a8b778c3f9026c4f89dae47d14a3f84816f), its light worker.

config_from_object with a settings module (onyx.background.celery.configs.light, which copies the
shared values of configs/base.py), values read from the environment, a Redis broker and result
backend, acks late, and the threads pool. No chord in this worker's tasks.
"""
