"""Each FM lesson's walkthrough (``lessons/<name>/README.md``): its steps, its links, and its quoted output the same as
what the session's own runs of the lesson print (``lab.walkthroughs``), with run ids, times and pids masked.

The comparison makes no run of its own: it reads the runs the lesson tests already made (``tests.lessons.runs``)."""

from __future__ import annotations

import re

import pytest

import lessons
from lab import walkthroughs
from lab.fm import ROOT
from lab.show import diff
from tests.lessons.runs import LabRuns

STEPS = ("## 1. Read the fix", "## 2. Run it", "## 3. Prove it", "## 4. The timeline of one document",
         "## 5. Break it yourself", "## 6. By hand", "## 7. Exercise")
KINDS = ["diff", "run", "prove", "timeline"]


@pytest.mark.parametrize("name", lessons.FMS)
def test_each_walkthrough_has_its_steps_in_order_and_a_block_of_output_for_each_run_step(name: str) -> None:
    text = walkthroughs.readme(name).read_text(encoding="utf-8")
    at = [text.find(step) for step in STEPS]
    assert -1 not in at and at == sorted(at), f"{name}: steps {dict(zip(STEPS, at))}"
    assert [b.kind for b in walkthroughs.blocks(text)] == KINDS
    assert all(b.body.strip() for b in walkthroughs.blocks(text)), f"{name}: an empty block (run --write)"
    assert "TODO" not in text
    for step in ("--diff", "--only", "--prove"):
        assert f"run_all_fms.py {step} {name}" in text or f"run_all_fms.py --only {name} {step}" in text, step


@pytest.mark.parametrize("name", lessons.FMS)
def test_each_walkthroughs_links_lead_to_files_and_its_fm_file_and_the_readme_link_to_it(name: str) -> None:
    text = walkthroughs.readme(name).read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)", text)
    assert [link for link in links if not (walkthroughs.readme(name).parent / link).resolve().exists()] == []
    module = lessons.modules()[name]
    assert f"lessons/{name}/README.md" in (ROOT / f"{module}.py").read_text().split('"""')[1]  # the docstring
    assert f"(lessons/{name}/README.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", lessons.FMS)
def test_each_walkthroughs_diff_is_the_step_the_command_prints(name: str) -> None:
    block = next(b for b in walkthroughs.blocks(walkthroughs.readme(name).read_text(encoding="utf-8")) if b.kind == "diff")
    step = diff.step(name)
    assert step is not None and block.body.splitlines() == walkthroughs.diff_block(name)


def test_masking_hides_what_changes_from_run_to_run_and_keeps_the_rest() -> None:
    one = ("fm2 fixed (scenario 2 on fm2, 1.9s): PASS (run 165335-643bc7)\n"
           "    #1 0.112s→        killed: the process died\n"
           "    #2 0.336→0.348s   ok\n"
           "ChordError: \"Dependency b1b4bbd4-9f9a-4ba2-8adf-ba7b3654aafe raised WorkerLostError('... Job: 6.')\"")
    two = ("fm2 fixed (scenario 2 on fm2, 12.25s): PASS (run 170001-0a1b2c)\n"
           "    #1 1.002s→        killed: the process died\n"
           "    #2 10.336→10.348s ok\n"
           "ChordError: \"Dependency 00000000-1111-2222-3333-444444444444 raised WorkerLostError('... Job: 12.')\"")
    assert walkthroughs.masked(one) == walkthroughs.masked(two)
    assert walkthroughs.masked(one) != walkthroughs.masked(one.replace("#2", "#3"))  # attempts are not masked
    assert walkthroughs.masked(one) != walkthroughs.masked(one.replace("PASS", "FAIL"))
    assert walkthroughs.masked(one) != walkthroughs.masked(one.replace("killed", "ok"))


@pytest.mark.parametrize("name", lessons.FMS)
def test_each_walkthroughs_output_is_what_this_sessions_runs_of_the_lesson_print(lab: LabRuns, name: str) -> None:
    runs = lab.of(name)
    assert all(r.ok for r in runs.values()), {k: r.verdict for k, r in runs.items()}
    found = walkthroughs.differences(name, runs)
    assert found == [], f"{walkthroughs.readme(name)} quotes output these runs do not print " \
                        f"(python -m lab.walkthroughs --write {name} rewrites it):\n" + "\n\n".join(found)
