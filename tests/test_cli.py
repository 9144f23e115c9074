from __future__ import annotations

import pytest

import run_all_fms
from lab import harness, services
from lab.fm import fm_modules
from lab.harness import HarnessError
from lab.settings import mask_url


def test_short_and_full_names_resolve() -> None:
    assert harness.resolve(["fm3", "fm4_duplicated_runs"]) == ["fm3", "fm4"]


def test_every_fm_file_is_found() -> None:
    assert list(fm_modules()) == [f"fm{i}" for i in range(7)]


def test_unknown_name_exits_2_with_the_valid_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--only", "fm9"]) == 2
    err = capsys.readouterr().err
    assert "unknown FM fm9" in err and "fm3 (fm3_dlq_reconciliation)" in err
    with pytest.raises(HarnessError):
        harness.resolve(["fm3", "nope"])


def test_default_selection_is_fm1_to_fm6() -> None:
    assert run_all_fms.selected(run_all_fms.parse_args([])) == [f"fm{i}" for i in range(1, 7)]


def test_plan_orders_runs() -> None:
    assert harness.plan(["fm1", "fm3"], include_fm0=True, prove=True) == [
        ("fm0", "bug"), ("fm1", "fixed"), ("fm1", "broken"), ("fm1", "weak"), ("fm3", "fixed"), ("fm3", "broken"),
        ("fm3", "weak")]
    assert harness.plan(["fm0"], include_fm0=False, prove=False) == [("fm0", "bug")]


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_user_url_that_does_not_answer_is_an_error_naming_it_masked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://lab:hunter2@127.0.0.1:1//")
    with pytest.raises(services.ServiceError) as info:
        services.ensure(say=lambda _: None)
    assert "amqp://lab:***@127.0.0.1:1//" in str(info.value) and "hunter2" not in str(info.value)
    assert run_all_fms.main(["--only", "fm1"]) == 2
    assert "hunter2" not in capsys.readouterr().err


def test_diff_prints_the_step_plain_in_a_pipe_without_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--diff", "fm4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== fm4: fm3_dlq_reconciliation.py -> fm4_duplicated_runs.py")
    assert "+from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered\n" in out and "-    send_email(pipeline_id, summary)\n" in out
    assert "\x1b[" not in out  # no colour codes in a pipe
    assert "Symptom" not in out and "FM-4: a duplicated" not in out  # docstrings left out


def test_diff_without_a_name_prints_every_step_and_a_bad_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--diff"]) == 0
    heads = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("== ")]
    assert heads == [f"== fm{i}" for i in range(1, 7)]
    assert run_all_fms.main(["--diff", "fm9"]) == 2
    assert "unknown FM fm9" in capsys.readouterr().err
