"""FM-2's checks: G2 (a crashed document runs again and ends ok) and S2 (it is lost: ChordError(WorkerLostError)).
"""

from __future__ import annotations

from lab.checks import chord_error, notify_never
from lab.fm import Fm
from lab.lesson import LessonChecks
from lab.records import Check, Collector, Observations


def g2(obs: Observations, fm: Fm) -> Check:
    c = Collector("G2")
    a3, a2 = obs.attempts.get("doc3", 0), obs.attempts.get("doc2", 0)
    c.expect(a3 == 2, f"doc3 attempts {a3}", "2")
    c.expect(a2 == 1, f"doc2 attempts {a2}", "1")
    c.expect("doc3" in obs.ok_docs(), f"doc3 {'ok' if 'doc3' in obs.ok_docs() else 'not ok'}", "ok")
    return c.result()


def s2(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S2")
    a3 = obs.attempts.get("doc3", 0)
    c.expect(a3 == 1, f"doc3 attempts {a3}", "1")
    chord_error(c, obs, "WorkerLostError")
    notify_never(c, obs)
    return c.result()


CHECKS = LessonChecks(
    guarantee=g2, symptom=s2,
    words={
        "G2": "a killed process: doc3 redelivered, ok",
        "S2": "early ack: the killed task is lost",
    },
)
