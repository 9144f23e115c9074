"""Read the Docs (https://github.com/readthedocs/readthedocs.org, commit 7937196123747181054d4c2361ec81f93c37f8f2).

Django settings held in a class (CommunityBaseSettings, and DockerBaseSettings over it), read with the
CELERY_ namespace; a Redis broker; acks late with a one-hour time limit and a 5-hour visibility timeout;
builds retried by autoretry_for with a fixed delay. Results ignored. No chord.
"""
