"""Each FM file is the Celery program it teaches (DESIGN.md §6), and the step from
the previous FM is its lesson: these tests keep the files honest (no broker needed)."""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any

import pytest

import lessons
from lab import harness
from lab.fm import ROOT, layers
from lessons import scenario
from lab.settings import NAMESPACE
from lab.show.diff import code_of, step
from shared.timeouts import BackstopRequest

FMS = list(lessons.modules().items())  # (short, module), fm0..fm9
STEPS = [short for short, _ in FMS if short != "fm0"]
MAX_CODE_LINES = 107  # fm9, the last stage, 107 (issue 40: the soft wait's watch and the fence, two lines each)
MAX_SPREAD = 60  # fm0 to fm9: nine fixes and their hard variants, a few lines each (fm7 adds four settings and the
# count of stored members, fm8 one guard on the result backend, a send-back and a retry, fm9 two settings, a cap
# on the time limits, the soft wait's watch of the connection and the redeliveries' fence, issue 40)
MAX_STEP = 25
STACK = ("app.task", "enveloped", "transient_retryable", "hard_timeout")
"""The designed decorator order, outermost first (DESIGN.md §1)."""
LAB_IMPORTS = {"lab.app", "lab.faults", "lab.pipeline"}
"""What an FM file may import from the lab to define its app and tasks (not the harness)."""
TASKS = ("fetch_document", "parse_document", "notify")


def tree(module: str) -> ast.Module:
    return ast.parse((ROOT / f"{module}.py").read_text())


def docstring(module: str) -> str:
    return ast.get_docstring(tree(module)) or ""


def tasks_in(module: str) -> dict[str, ast.FunctionDef]:
    found = {n.name: n for n in tree(module).body if isinstance(n, ast.FunctionDef)}
    return {name: found[name] for name in TASKS}


def decorator_name(d: ast.expr) -> str:
    target = d.func if isinstance(d, ast.Call) else d
    return ast.unparse(target)


def test_every_fm_file_is_there() -> None:
    assert [short for short, _ in FMS] == [f"fm{i}" for i in range(10)]


def test_each_fm_file_is_short_and_they_are_about_the_same_size() -> None:
    sizes = {module: len(code_of(module)) for _, module in FMS}
    assert max(sizes.values()) <= MAX_CODE_LINES, sizes
    assert max(sizes.values()) - min(sizes.values()) <= MAX_SPREAD, sizes


SKELETON = ("Symptom", "Root cause", "Fix", "Costs", "Still open", "Run it", "Deeper")
"""The parts of an FM docstring after its one-line summary, in this order (DESIGN.md §6, issue 41)."""
BUDGET = {"summary": 20, "Symptom": 80, "Root cause": 60, "Fix": 170, "Costs": 60, "Still open": 25, "Run it": 110,
          "Deeper": 20}
"""Words per part, the part's heading and its run commands included."""
MAX_DOC_WORDS = 400
"""The whole docstring, run commands included."""
MAX_MEDIAN_SENTENCE = 15
"""Words in the median sentence (a sentence ends at ``.``, ``!`` or ``?`` before a capital, a quote or a list)."""
_PART = re.compile(r"^(?P<name>[A-Z][a-z ]+?)(?: \([^)]*\))?:(\s|$)")
FORBIDDEN = {
    "a claim or check number (say what it shows)": r"\b[GSC]\d{1,2}\b",
    "a document of a hard variant (say what it is)": r"\bdoc(?:9|[1-9]\d)\b",
    "the lab's internal names": r"side chord|\bfm\dw\b|\bweak\b|hard variant",
}


def parts(module: str) -> dict[str, str]:
    """The docstring's summary and its headed parts (a part runs until the next heading)."""
    paragraphs = [p for p in re.split(r"\n\s*\n", docstring(module)) if p.strip()]
    found: dict[str, list[str]] = {"summary": [paragraphs[0]]}
    current = found["summary"]
    for para in paragraphs[1:]:
        m = _PART.match(para)
        if m and m.group("name") in SKELETON:
            current = found.setdefault(m.group("name"), [])
        current.append(para)
    return {name: "\n\n".join(text) for name, text in found.items()}


def sentences(text: str) -> list[str]:
    prose = " ".join(line for line in text.splitlines() if not line.startswith("    "))  # not the run commands
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\"-])", re.sub(r"\s+", " ", prose)) if s.split()]


@pytest.mark.parametrize(("short", "module"), FMS)
def test_each_docstring_is_the_lesson_in_its_fixed_skeleton_and_budget(short: str, module: str) -> None:
    found = parts(module)
    assert found["summary"].startswith(f"FM-{short[2:]}: ") and "\n" not in found["summary"].strip()
    assert list(found) == ["summary", *SKELETON], f"{module}: parts {list(found)}, the skeleton is {SKELETON}"
    words = {name: len(text.split()) for name, text in found.items()}
    assert {n: w for n, w in words.items() if w > BUDGET[n]} == {}, f"{module}: {words} (budget {BUDGET})"
    assert len(docstring(module).split()) <= MAX_DOC_WORDS, module
    lengths = sorted(len(s.split()) for s in sentences(docstring(module)))
    assert lengths[len(lengths) // 2] <= MAX_MEDIAN_SENTENCE, (module, lengths)


@pytest.mark.parametrize(("short", "module"), FMS)
def test_a_docstring_names_no_claim_number_and_no_internal_name(short: str, module: str) -> None:
    doc = docstring(module)
    for what, pattern in FORBIDDEN.items():
        assert not re.findall(pattern, doc), f"{module}'s docstring has {what}: {re.findall(pattern, doc)}"


@pytest.mark.parametrize(("short", "module"), FMS)
def test_the_deeper_line_points_at_pages_that_exist(short: str, module: str) -> None:
    deeper = parts(module)["Deeper"]
    pages = re.findall(r"[\w./-]+\.md", deeper)
    assert "docs/failure-modes.md" in pages and "docs/celery-versions.md" in pages, deeper
    assert [p for p in pages if not (ROOT / p).is_file()] == []
    section = re.search(r"section (FM-[\w /-]+?)\)", deeper)
    assert section is not None and f"## {section.group(1)}" in (ROOT / "docs" / "failure-modes.md").read_text()


@pytest.mark.parametrize("fm", STEPS)
def test_the_step_from_the_previous_fm_is_small_and_is_the_fix_its_docstring_names(fm: str) -> None:
    """Each bullet of the docstring's Fix opens with the setting or primitive it adds, with a Celery version."""
    s = step(fm)
    assert s is not None
    assert s.changed <= MAX_STEP, f"{fm} changes {s.changed} lines (at most {MAX_STEP}):\n{s.text}"
    fix = parts(s.after)["Fix"]
    bullets = re.split(r"\n- ", fix)[1:]
    assert bullets, f"{s.after}'s docstring has no bullet in its Fix"
    named = [m.group(1) for b in bullets if (m := re.match(r"``(.+?)``", b))]
    assert len(named) == len(bullets), f"{s.after}: a Fix bullet that does not open with what it adds: {bullets}"
    missing = [name for name in named if not any(name in line for line in s.added)]
    assert not missing, f"{fm}'s docstring names {missing} as its fix, but the step does not add them:\n{s.text}"
    version = re.compile(r"Celery 5(\.\d)?\b|\b5\.\d\+|5\.5 to 5\.7")
    heading = fix.split("\n- ")[0]
    assert version.search(heading) or all(version.search(b) for b in bullets), f"{s.after}: a Fix bullet with no Celery version"


@pytest.mark.parametrize(("short", "module"), FMS)
def test_each_docstring_gives_the_worker_command_the_harness_runs(short: str, module: str) -> None:
    fm = harness.load(short)
    doc = docstring(module)
    assert f"    {fm.worker_command()}\n" in doc
    assert f"    {fm.submit_command()}\n" in doc


@pytest.mark.parametrize(("short", "module"), FMS)
def test_no_fm_file_imports_the_harness_to_define_its_app_or_tasks(short: str, module: str) -> None:
    imported: set[str] = set()
    for node in tree(module).body:  # module level only: the `if __name__ == "__main__"` block may run it
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    lab = {name for name in imported if name == "lab" or name.startswith("lab.")}
    assert lab <= LAB_IMPORTS, f"{module} imports {sorted(lab - LAB_IMPORTS)}"
    assert "run_all_fms" not in imported


@pytest.mark.parametrize(("short", "module"), FMS)
def test_the_program_is_in_the_file_three_tasks_and_submit(short: str, module: str) -> None:
    names = {n.name for n in tree(module).body if isinstance(n, ast.FunctionDef)}
    assert {*TASKS, "submit"} <= names
    args = {name: [a.arg for a in fn.args.args] for name, fn in tasks_in(module).items()}
    assert args["fetch_document"] == ["self", "doc_id"]
    assert args["parse_document"] in (["self", "document"], ["self", "fetched"])
    assert args["notify"] == ["self", "results", "pipeline_id"]  # the documents come from the manifest (linear cost)


@pytest.mark.parametrize(("short", "module"), FMS)
def test_every_task_stacks_its_decorators_in_the_designed_order(short: str, module: str) -> None:
    for name, fn in tasks_in(module).items():
        stack = [decorator_name(d) for d in fn.decorator_list]
        assert stack and stack[0] == "app.task", f"{module}.{name}: {stack}"
        assert [s for s in STACK if s in stack] == stack, f"{module}.{name} stacks {stack}, the design says {STACK}"
    # and the task Celery registered is wrapped in that order (wraps() copies __qualname__, not the code)
    parse = importlib.import_module(module).parse_document
    wrappers = [str(getattr(f, "__code__").co_qualname).split(".<locals>")[0] for f in list(layers(parse.run))[:-1]]
    declared = [decorator_name(d) for d in tasks_in(module)["parse_document"].decorator_list]
    assert wrappers == [s for s in STACK[1:] if s in declared]


@pytest.mark.parametrize(("short", "module"), FMS)
def test_at_most_one_lab_line_per_task_body(short: str, module: str) -> None:
    source = (ROOT / f"{module}.py").read_text().splitlines()
    for name, fn in tasks_in(module).items():
        body = source[fn.body[0].lineno - 1:fn.end_lineno]
        lab_lines = [line for line in body if "lab_fault(" in line]
        assert len(lab_lines) <= 1, f"{module}.{name}: {lab_lines}"
        assert all("# the lab" in line for line in lab_lines), f"{module}.{name}: say it is the lab's: {lab_lines}"


@pytest.mark.parametrize(("short", "module"), FMS)
def test_each_fm_adds_its_fix_and_keeps_the_earlier_ones(short: str, module: str) -> None:
    n = int(short[2:])
    fm = harness.load(short)
    conf: Any = fm.app.conf
    source = "\n".join(code_of(module))
    assert fm.scenario == max(n, 1)
    assert ("@enveloped" in source) is (n >= 1)
    assert conf.task_acks_late is (n >= 2) and conf.task_reject_on_worker_lost is (n >= 2)
    assert fm.concurrency == (2 if n >= 2 else 1)
    assert (fm.delivery_bound == 3) is (n >= 3) and fm.beat is (n >= 3) and (fm.dead_letter_queue is not None) is (n >= 3)
    assert ("NotifyClaim" in source) is (n >= 4)
    assert (fm.retry_policy is not None) is (n >= 5)
    assert (fm.hard_timeout is not None) is (n >= 6)
    assert fm.prefetch_one is (n >= 7) and (dict(fm.worker_env).get("REMAP_SIGTERM") == "SIGQUIT") is (n >= 7)
    assert ("reject_unstored(app)" in source) is (n >= 8) and ("send_back_rejected=True" in source) is (n >= 8)
    assert ("RejectUnstored" in str(fm.app.loader.override_backends.get("redis"))) is (n >= 8)
    assert bool(conf.broker_channel_error_retry) is (n >= 9)
    assert bool(conf.worker_cancel_long_running_tasks_on_connection_loss) is (n >= 9)
    assert ("within_consumer_timeout(app, CONSUMER_TIMEOUT)" in source) is (n >= 9)


def test_every_fm6_task_has_in_body_deadlines_below_celerys_backstop_and_no_celery_soft_limit() -> None:
    """Issue 20: no Celery limit may fire outside the body while an in-body deadline is meant to end it."""
    fm = harness.load("fm6")
    assert fm.fetch_document is not None
    for task in (fm.fetch_document, fm.parse_document, fm.notify):
        layers_ = list(layers(task.run))
        soft = next(getattr(f, "soft_timeout_seconds") for f in layers_ if hasattr(f, "soft_timeout_seconds"))
        hard = next(getattr(f, "hard_timeout_seconds") for f in layers_ if hasattr(f, "hard_timeout_seconds"))
        assert task.soft_time_limit is None, task.name
        assert task.time_limit is not None and 0 < soft < hard < task.time_limit, task.name
        assert getattr(task, "Request") is BackstopRequest, task.name


@pytest.mark.parametrize(("short", "module"), FMS)
def test_every_name_an_fm_owns_is_in_its_namespace(short: str, module: str) -> None:
    fm = harness.load(short)
    for name in (*fm.queue_names, *fm.exchange_names):
        assert name.startswith(f"{NAMESPACE}.{short}.")
    assert fm.app.conf.accept_content == ["json"]
    assert fm.app.conf.result_backend_transport_options["global_keyprefix"] == f"{NAMESPACE}:{short}:"


def test_fm3_task_queue_is_a_bounded_quorum_queue_that_dead_letters_to_its_dlq() -> None:
    fm = harness.load("fm3")
    args = fm.task_queues[0].queue_arguments or {}
    assert args["x-queue-type"] == "quorum" and args["x-delivery-limit"] == 2
    assert fm.dead_letter_queue is not None and fm.dead_letter_queue.exchange is not None
    assert args["x-dead-letter-exchange"] == fm.dead_letter_queue.exchange.name
    assert fm.queue_names == (f"{NAMESPACE}.fm3.tasks", f"{NAMESPACE}.fm3.tasks.dlq", f"{NAMESPACE}.fm3.tasks.dlq.parked")


def test_scenarios_are_cumulative() -> None:
    assert scenario(1).docs == ("doc1", "doc2")
    assert scenario(3).docs == ("doc1", "doc2", "doc3", "doc4", "doc9")  # doc9: scenario 3's hard variant
    assert set(scenario(6).docs) == {f"doc{i}" for i in range(1, 31)} | {"doc90"}
    assert [side.tag for side in scenario(1).sides] == ["expired"] == [side.tag for side in scenario(2).sides]
    assert [side.tag for side in scenario(3).sides] == ["expired", "body", "behind"] == [side.tag for side in scenario(6).sides]
    assert scenario(5).burst == tuple(f"doc{i}" for i in range(12, 28)) and not scenario(4).burst
    assert "duplicate notify" not in scenario(3).injectors and "duplicate notify" in scenario(4).injectors
    assert [side.tag for side in scenario(7).sides] == ["expired", "body", "behind", "cancelled", "deploy", "stored"]
    assert scenario(7).docs == scenario(6).docs  # the slow documents are the side chord's, not the main chord's
    assert [side.tag for side in scenario(8).sides] == ["expired", "body", "behind", "cancelled", "deploy", "stored",
                                                        "outage"]
    assert scenario(8).docs == scenario(6).docs and [s.injector for s in scenario(8).sides][-1] == "backend outage"
    assert [side.tag for side in scenario(9).sides] == ["expired", "body", "behind", "cancelled", "deploy", "stored",
                                                        "outage", "connloss", "cutstored", "softcut", "overlong"]
    assert scenario(9).docs == scenario(6).docs and [s.injector for s in scenario(9).sides][-4:] == ["connection cut"] * 4
    with pytest.raises(ValueError):
        scenario(10)
