"""FM-7, rolling deploys (``fm7_rolling_deploys.py``)."""

from __future__ import annotations

from lessons.fm7.checks import MIN_DEPLOYS
from lessons.fm7.scenario import DEPLOYS
from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_rolling_deploys_dead_letter_no_innocent_document_and_lose_none(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm7")["fixed"], 7)
    deploy = obs.sides["deploy"]
    assert MIN_DEPLOYS <= sum(1 for e in deploy.events if e.kind == "deploy_term") <= DEPLOYS
    assert not any(e.kind == "dead_lettered" for e in deploy.events) and len(deploy.emails) == 1


def test_with_a_warm_shutdown_longer_than_the_grace_a_deploy_kills_a_document_mid_body(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm7")["broken"], 7, "fm6", "S7")
    kills = [e for e in obs.sides["deploy"].events if e.kind == "deploy_kill"]
    assert MIN_DEPLOYS <= len(kills) <= DEPLOYS and any(e.get("lost") for e in kills)
