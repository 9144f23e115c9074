"""What FM-1's lesson adds to the scenarios: a document that fails, a healthy one, and a chain head that expired."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from celery import chain, chord, group
from celery.result import AsyncResult

from lab.faults import FAIL
from lab.injector import Injector, RunView, SideView
from lab.scenarios import Doc, Part, SideChord
from shared.manifest import write_manifest

EXPIRED = "expired"
"""The side chord whose chain head is sent already expired (FM-1's hard variant)."""


class ExpiredHeads(Injector):
    """Sends its side chord as the program's ``submit`` would, but each chain head (``fetch_document``) with an
    expiry already passed: Celery then sends AMQP expiration 0, a consumer with room takes it at once, and the
    worker finds it expired. A program with no chain head gets its own ``submit``."""

    def send(self, run: RunView, side: SideView) -> None:
        fm = run.fm
        fetch, parse, notify = fm.fetch_document, fm.parse_document, fm.notify
        if fetch is None:
            side.submit()
            return

        def expired(doc_ids: list[str]) -> AsyncResult[Any]:
            header = group(chain(fetch.s(d).set(expires=datetime.now(timezone.utc) - timedelta(seconds=1)), parse.s())
                           for d in doc_ids)
            write_manifest(fm.app, side.run_id, doc_ids)  # as the FM's submit does
            return chord(header)(notify.s(side.run_id))

        side.submit_with(expired)


PART = Part(
    docs=(Doc("doc1", FAIL, "a malformed document: raises on every attempt"),
          Doc("doc2", None, "a healthy document, the control")),
    sides=(SideChord(EXPIRED, (Doc("doc31", None, "a healthy document whose fetch expired before it ran"),),
                     "a chain head that expired before it ran", purpose="a chain head sent already expired",
                     injector="expired heads"),),
    injectors={"expired heads": ExpiredHeads},
)

