"""The workshop report: its HTML from synthetic runs (no broker), and the page in a real headless browser.

The browser is Debian's ``chromium`` (``/usr/bin/chromium``; ``.ci/run`` installs it), and
the print test reads the printed PDF with poppler's ``pdftotext`` (``poppler-utils``).
Without them the browser tests are skipped, saying why, unless ``RCL_REQUIRE_BROWSER=1``
(set by ``.ci/run``) makes them fail instead. Every chromium run has its
own profile folder, is bounded by a timeout, and its whole process group is
killed afterwards. The screenshots and the printed PDF (and its pages as PNG, when
``pdftoppm`` is there) are kept in ``artifacts/report-test/`` (git-ignored) for a
person to look at.

Geometry (a section's height, a lane's width, whether a lane's name covers a mark) is
measured in the browser by a copy of the page with a measuring script added (the
report itself has no script and a policy that forbids one).

One piece: the handout's tests, from its HTML to the printed page, share the synthetic runs and the browser
they open.
"""

from __future__ import annotations

import dataclasses
import html as html_text
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast

import pytest

import run_all_fms
import lessons
from lab.matrix import TITLES
from lab.records import Outcome
from lab.show import report, timeline, timeline_text
from shared.envelope import REASONS
from lab.fm import ROOT
from lab.records import RunReport
from lab.records import Check
from tests.synthetic import (BURST, FOREIGN, LARGE_BROKEN_CHECK, LARGE_CHECKS, LARGE_WEAK_CHECK, broken_run, end, ev, fixed_sides,
                             large_broken_run, large_fixed_run, large_weak_run, lesson_run, member_failure_run,
                             notify_story_run, observations, sided_run, start, summary_outcome, weak_sides_run)

CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")
PDFTOTEXT = Path(shutil.which("pdftotext") or "/usr/bin/pdftotext")
BROWSER_TIMEOUT = 60.0
ARTIFACTS = ROOT / "artifacts"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
DOC_LANES = [f"doc{i}" for i in range(1, 9)] + ["doc11"]
LANES = DOC_LANES + ["notify", "duplicate #1", "duplicate #2"]  # the chord's notify, the duplicate's two deliveries
SCREEN = (1280, 800)
ABOUT_TWO_SCREENS = 2 * SCREEN[1] + 200
"""An FM's section is at most about two screens of 1280 x 800 (the old report: 2,600-4,000 px an FM; before FM-7..9
were drawn, real fm6..fm9 measured 1,926, 1,876, 2,004 and 2,319 px)."""
EVIL = "<script>alert('doc1')</script> & \"quoted\""


class Outline(HTMLParser):
    """What a test needs from the page: FM sections, their figures' lanes, marks, checks, headings."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.lanes: dict[tuple[str, str], list[str]] = {}  # (section id, figure kind) -> lanes' data-doc
        self.same: dict[tuple[str, str], list[str]] = {}  # (section id, figure kind) -> documents told "as above"
        self.sides: dict[tuple[str, str], list[str]] = {}  # (section id, figure kind) -> side chords drawn, lane or line
        self.side_lines: dict[tuple[str, str], list[str]] = {}  # the side chords told in a line of words (no plot)
        self.marks: dict[str, set[str]] = {}  # section id -> mark kinds drawn
        self.checks: dict[str, list[str]] = {}  # section id -> check labels
        self.lessons: dict[str, list[str]] = {}  # section id -> docstring parts shown
        self.headings: list[str] = []  # the text of every h1..h4
        self.tags: set[str] = set()
        self._section, self._figure = "", ""
        self._heading: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        self.tags.add(tag)
        if tag in ("h1", "h2", "h3", "h4"):
            self._heading = []
        if tag == "section" and "fm" in classes:
            self._section = a["id"]
            self.sections.append(self._section)
        elif tag == "figure" and "timeline" in classes:
            self._figure = a["data-kind"]
        elif tag == "div" and "lane" in classes:
            self.lanes.setdefault((self._section, self._figure), []).append(a["data-doc"])
            if "data-side" in a:
                self.sides.setdefault((self._section, self._figure), []).append(a["data-side"])
        elif tag == "div" and "side" in classes:
            self.sides.setdefault((self._section, self._figure), []).append(a["data-side"])
            self.side_lines.setdefault((self._section, self._figure), []).append(a["data-side"])
        elif tag == "div" and "same" in classes:
            self.same.setdefault((self._section, self._figure), []).extend(a["data-docs"].split())
        elif tag == "g" and "mark" in classes:
            self.marks.setdefault(self._section, set()).update(c[5:] for c in classes if c.startswith("mark-"))
        elif tag == "li" and "check" in classes:
            self.checks.setdefault(self._section, []).append(a["data-label"])
        elif tag == "div" and "lesson" in classes:
            self.lessons.setdefault(self._section, []).append(a["data-part"])

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h1", "h2", "h3", "h4") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None


def _reports() -> list[RunReport]:
    fixed = [Check(f"G{i}", True, f"guarantee {i} held") for i in range(1, 7)]
    return [
        RunReport("fm5", "fixed", "fm5", 5, [Check("G5", False, EVIL)], sided_run(), None, None, 3.1),
        RunReport("fm6", "fixed", "fm6", 6, fixed, sided_run(doc1_error=EVIL), None, None, 3.5),
        RunReport("fm6", "broken", "fm5", 6, [Check("S6", True, "doc8 still running after 2.2s")], broken_run(), None, None, 3.6),
    ]


@pytest.fixture(scope="module")
def page() -> str:
    lessons = {fm: report.lesson(fm) for fm in ("fm5", "fm6")}
    return report.render(_reports(), lessons, "generated by a test")


# ---- the HTML ------------------------------------------------------------------


BROKEN_LANES = ["doc3", "doc4", "doc5", "doc6", "doc7", "doc8", "notify"]
"""fm6's broken run: doc1 and doc2 did what they did in the fixed run (one line says so); doc6 and doc11, never
started, share a lane (a later run groups two with one story, wherever they stand); notify never ran."""


def test_a_section_per_fm_with_a_lane_per_document_in_each_runs_timeline(page: str) -> None:
    outline = Outline(page)
    assert 'data-docs="doc6 doc11"><span class="name">doc6, doc11</span>' in page
    assert outline.sections == ["fm5", "fm6"]
    assert outline.lanes == {("fm5", "fixed"): LANES, ("fm6", "fixed"): LANES, ("fm6", "broken"): BROKEN_LANES}
    assert outline.same == {("fm6", "broken"): ["doc1", "doc2"]}
    # the fixed runs' side chords completed: a line of words each, no lane
    sides = ["expired", "body", "behind"]
    assert outline.sides == outline.side_lines == {("fm5", "fixed"): sides, ("fm6", "fixed"): sides}
    # the broken run's cell sits beside the change (what happens without it), above the fixed run's checks
    assert outline.checks == {"fm5": ["G5"], "fm6": ["S6", "G1", "G2", "G3", "G4", "G5", "G6"]}
    fm6 = page.split('<section class="fm" id="fm6">')[1]
    assert re.search(r'<div class="beside-change"><div class="change" data-fm="fm6">.*?</div><div class="others">'
                     r'<div class="cell" data-kind="broken">', fm6, re.S)
    assert '<div class="cells wide"><div class="cell" data-kind="fixed">' in fm6
    assert '<section class="fm" id="fm6">' in page and '<div class="lane" data-doc="doc4"' in page


def test_every_envelope_reason_kill_retry_and_dead_letter_has_its_mark_and_a_legend_entry(page: str) -> None:
    outline = Outline(page)
    # expired and revoked: the heads of the side chord "expired", marked in its line of words
    assert outline.marks["fm6"] >= {*REASONS, "ok", "killed", "retried", "running", "email"}
    for key in (*REASONS, "killed", "retried", "running", "kept", "deduplicated", "member_failure", "store_stall"):
        assert f'class="legend-item" data-mark="{key}"' in page.split("</aside>")[0]  # the legend at the top


def test_each_fm_lists_the_marks_its_timelines_use(page: str) -> None:
    fm6 = page.split('<section class="fm" id="fm6">')[1]
    legend = fm6.split('<div class="fm-legend">')[1].split("</div>")[0]
    listed = set(re.findall(r'data-mark="(\w+)"', legend))
    assert listed == Outline(page).marks["fm6"] | {"running"}  # every mark drawn, and "never ran" (the broken notify)
    assert "kept" not in listed and "deduplicated" not in listed


def test_the_fixed_and_broken_verdicts_sit_in_the_matrix_and_in_the_section(page: str) -> None:
    assert '<span class="verdict ok">PASS</span> G1 G2 G3 G4 G5 G6' in page
    assert '<span class="verdict shown">REPRODUCED</span> S6' in page
    assert '<span class="verdict bad">FAIL</span> G5' in page  # fm5's failing check
    assert "doc8 still running after 2.2s" in page


def _css_rule(page: str, selector: str) -> str:
    found = re.search(re.escape(selector) + r"\{([^}]*)\}", page.split("<style>")[1].split("</style>")[0])
    assert found, f"no CSS rule for {selector}"
    return found.group(1)


def test_a_symptom_reproduced_has_a_neutral_badge_not_a_green_one(page: str) -> None:
    assert _css_rule(page, ".verdict.ok") == "background:#2e7d32"  # PASS: green
    assert _css_rule(page, ".verdict.shown") == "background:#546e7a"  # REPRODUCED: slate
    assert _css_rule(page, ".verdict.bad") == "background:#c62828"
    bug = RunReport("fm0", "bug", "fm0", 1, [Check("S1", True, "notify ran 0x")], broken_run(), None, None, 1.0)
    missed = dataclasses.replace(bug, fm="fm1", kind="broken", checks=[Check("S1", False, "notify ran 1x")])
    html = report.render([bug, missed], {})
    assert '<span class="verdict shown">BUG REPRODUCED</span> S1' in html
    assert '<span class="verdict bad">NOT REPRODUCED</span> S1' in html


def test_every_check_is_named_in_words_where_it_appears(page: str) -> None:
    fm6 = page.split('<section class="fm" id="fm6">')[1]
    assert ('<li class="check ok" data-label="G3"><b>G3</b> <span class="words">(poison dead-lettered at the bound; '
            'body; letters parked)</span>: holds<span class="seen">guarantee 3 held</span></li>') in fm6
    assert ('<li class="check shown" data-label="S6"><b>S6</b> <span class="words">(a hang pins a slot, notify never runs)'
            '</span>: reproduced<span class="seen">doc8 still running after 2.2s</span></li>') in fm6
    glossary = page.split('<ul class="glossary">')[1].split("</ul>")[0]
    assert re.findall(r'data-label="([^"]+)"', glossary) == ["G5", "G1", "G2", "G3", "G4", "G6", "S6"]
    assert "<b>S6</b> a hang pins a slot, notify never runs" in glossary


def test_every_check_the_lab_makes_has_its_words() -> None:
    sources = [*sorted((ROOT / "lessons").glob("*/checks.py")), *sorted((ROOT / "case_studies").glob("*/study.py"))]
    labels = {m for path in sources for m in re.findall(r'Collector\("([^"]+)"\)', path.read_text())}
    labels |= {f"BL{3 + n} write-up" for n in range(1, 6)}  # bl_ingestion's Collector(f"BL{3 + sc.number} write-up")
    assert len(labels) > 40
    assert sorted(label for label in labels if not TITLES.get(label)) == []


def test_the_lesson_comes_from_the_fm_docstring(page: str) -> None:
    assert Outline(page).lessons["fm6"] == ["symptom", "root cause", "fix", "tradeoffs"]
    assert "<code>@hard_timeout(1.5, soft=1)</code>" in page  # fm6's Fix paragraph, ``code`` rendered


def test_the_runs_of_one_fm_share_one_time_scale_and_checks_read_as_short_lines(page: str) -> None:
    fm6 = page.split('<section class="fm" id="fm6">')[1]
    axes = [re.findall(r'<text x="[\d.]+%" y="12" text-anchor="middle">([\d.]+)</text>', fig.split('class="axis zoom"')[0])
            for fig in fm6.split('<figure class="timeline"')[1:]]
    assert len(axes) == 2 and axes[0] == axes[1] and axes[0][-1] == "2"  # the broken run's 2.4 s sets both
    assert ('<li class="check ok" data-label="G1"><b>G1</b> <span class="words">(notify once, chord SUCCESS, all '
            'accounted; expired head)</span>: holds<span class="seen">guarantee 1 held</span></li>') in fm6


def test_each_section_shows_the_change_from_the_previous_fm(page: str) -> None:
    assert '<div class="change" data-fm="fm6"><h3>The change</h3>' in page
    assert ('<span class="d-add">+@hard_timeout(1.5, soft=1)  # FM-6: SIGALRM asks (SoftTimeLimitExceeded) at 1 s, '
            'raises HardTimeout at 1.5 s</span>') in page
    assert ("<code>fm5_transient_failures.py</code> → <code>fm6_task_timeouts.py</code>, docstrings left out: "
            "7 lines added, 3 removed") in page
    assert '<span class="d-file">' not in page  # the diff's own file lines would say it again
    assert "Symptom (fm5 on scenario 6)" not in page.split('<div class="change" data-fm="fm6">')[1].split("</pre>")[0]


def test_everything_from_a_run_is_escaped(page: str) -> None:
    assert "<script" not in page
    assert "&lt;script&gt;alert(&#x27;doc1&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in page


def test_the_page_fetches_nothing(page: str) -> None:
    assert "default-src 'none'" in page  # the Content-Security-Policy forbids every request
    for needle in ("<link", "<script", "<img", "<iframe", "src=", "url(", "@import", "https:"):
        assert needle not in page
    assert page.count("http://") == page.count('xmlns="http://www.w3.org/2000/svg"')


def test_a_docstring_splits_into_its_headed_paragraphs() -> None:
    doc = '''FM-9: one line.

Symptom (fm8 on scenario 9): it breaks
over two lines.

Root cause: a cause.

Fix (``shared/x.py``):

- first, with ``code``
  and a second line;
- second.

Delta from fm8: not shown.

Trade-offs: *some*.

Run it alone (two shells): not shown either.
'''
    lesson = report.parse_docstring("fm9", "fm9_x", doc)
    assert lesson.summary == "FM-9: one line."
    assert lesson.sections == {
        "Symptom": "(fm8 on scenario 9) it breaks\nover two lines.",
        "Root cause": "a cause.",
        "Fix": "(``shared/x.py``)\n\n- first, with ``code``\n  and a second line;\n- second.",
        "Tradeoffs": "*some*.",
    }


@pytest.mark.parametrize("fm", sorted(lessons.modules()))
def test_every_fm_docstring_gives_symptom_root_cause_and_fix(fm: str) -> None:
    lesson = report.lesson(fm)
    wanted = ["Symptom", "Root cause", "Fix"] + (["Tradeoffs"] if fm != "fm0" else [])
    assert [name for name in wanted if lesson.sections.get(name, "").strip()] == wanted


def test_write_puts_one_file_at_the_path(tmp_path: Path) -> None:
    path = report.write(tmp_path / "lab-report.html", _reports())
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.usefixtures("real_services")
def test_the_cli_writes_the_report_of_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lab-report.html"
    assert run_all_fms.main(["--include-fm0", "--only", "fm0", "--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fm0 bug [" in out and "] running the scenario ..." in out  # plain progress: not a terminal
    assert "--- fm0: what happened to each document" in out and "notify  never ran" in out
    assert f"report: {path}" in out
    outline = Outline(path.read_text(encoding="utf-8"))
    assert outline.sections == ["fm0"] and outline.lanes == {("fm0", "bug"): ["doc1", "doc2", "notify"]}
    assert outline.checks == {"fm0": ["S1"]} and "error" in outline.marks["fm0"]


def test_a_report_path_that_cannot_be_written_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def run_plan(runs: object) -> list[RunReport]:
        return _reports()  # no broker needed for this one

    monkeypatch.setattr(run_all_fms, "run_plan", run_plan)
    monkeypatch.setattr(run_all_fms.services, "ensure", lambda: None)
    assert run_all_fms.main(["--only", "fm6", "--report", str(tmp_path / "missing" / "r.html")]) == 2
    assert f"the folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err  # said before any run


# ---- in a real browser -------------------------------------------------------------

@pytest.fixture
def browser() -> Path:
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is missing: the browser tests need Debian's chromium (apt-get install -y chromium)"
        if os.environ.get("RCL_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return CHROMIUM


def chromium(url: str, *flags: str) -> tuple[str, str]:
    """Run headless chromium once on ``url``; its stdout and stderr. Bounded, and no process left behind."""
    with tempfile.TemporaryDirectory() as home:
        out, err = Path(home) / "stdout", Path(home) / "stderr"
        with out.open("w") as stdout, err.open("w") as stderr:  # files, not pipes: a helper may outlive chromium
            proc = subprocess.Popen([str(CHROMIUM), *FLAGS, f"--user-data-dir={home}/profile", *flags, url],
                                    stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                proc.wait(timeout=BROWSER_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"chromium did not finish within {BROWSER_TIMEOUT:.0f}s: {err.read_text()[-2000:]}")
            finally:
                _kill_group(proc.pid)
                proc.wait()
        return out.read_text(errors="replace"), err.read_text(errors="replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to the console (errors, CSP violations), from ``--enable-logging=stderr``."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report_file(page: str) -> Iterator[Path]:
    folder = ARTIFACTS / "report-test"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "report.html"
    path.write_text(page, encoding="utf-8")
    yield path


@pytest.mark.usefixtures("browser")
def test_the_browser_logs_what_the_page_does_wrong(tmp_path: Path) -> None:
    """The control: a page that breaks its own policy is caught by ``console_messages``."""
    bad = tmp_path / "bad.html"
    head = report.render([], {}).split("<body>")[0]
    bad.write_text(head + '<body><img src="http://example.invalid/x.png"></body></html>', encoding="utf-8")
    _, err = chromium(bad.as_uri(), "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert any("Content Security Policy" in line for line in console_messages(err)), err[-2000:]


@pytest.mark.usefixtures("browser")
def test_the_report_loads_in_a_browser_without_console_errors_and_has_every_section(report_file: Path) -> None:
    dom, err = chromium(report_file.as_uri(), "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert console_messages(err) == []
    outline = Outline(dom)
    assert outline.sections == ["fm5", "fm6"]
    assert outline.lanes == {("fm5", "fixed"): LANES, ("fm6", "fixed"): LANES, ("fm6", "broken"): BROKEN_LANES}
    assert "svg" in outline.tags and "script" not in outline.tags


@pytest.mark.usefixtures("browser")
def test_the_report_renders_to_a_screenshot(report_file: Path) -> None:
    shot = report_file.with_suffix(".png")
    shot.unlink(missing_ok=True)
    chromium(report_file.as_uri(), "--hide-scrollbars", "--window-size=1280,2200", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000  # a page with content, not a blank one


CHUNKS = [f"chunk{i:03d}" for i in range(8)]


def _chunk_run(*, reconciled: bool = True) -> RunReport:
    """Case study 1's fixed run: chunk001 retried, chunk003 killed and redelivered, five healthy chunks, ``reconcile``."""
    events = [start(0.01, "chunk000", 1), end(0.2, "chunk000", 1),
              start(0.02, "chunk001", 1), end(0.1, "chunk001", 1, "error", "FeatureStoreUnavailable: 503"),
              ev(0.101, "retry", doc="chunk001", retry=1, delay="0.2"), start(0.31, "chunk001", 1 + 1), end(0.4, "chunk001", 2),
              start(0.2, "chunk002", 1), end(0.25, "chunk002", 1),
              start(0.22, "chunk003", 1), start(0.6, "chunk003", 2), end(0.7, "chunk003", 2),
              *(e for i, d in enumerate(CHUNKS[4:]) for e in (start(0.3 + 0.02 * i, d, 1), end(0.35 + 0.02 * i, d, 1)))]
    if reconciled:
        events += [ev(0.8, "notify_start", role="chord"), ev(0.85, "notify_end", role="chord", outcome="ok")]
    chord = summary_outcome(CHUNKS, []) if reconciled else Outcome("PENDING", None, None, None)
    obs = dataclasses.replace(observations(events, chord, fm="sb", elapsed=0.9), docs=tuple(CHUNKS))
    return RunReport("severity_batch/batch", "fixed", "sb", 1, checks=[Check("SB1", True, "manifest: dispatched 2000")],
                     observations=obs, seconds=1.2, body="reconcile")


def _case_page() -> str:
    batch = _chunk_run()
    later = dataclasses.replace(batch, fm="severity_batch/dead_chunk", scenario=2, checks=[Check("SB5", True, "flagged")])
    no_chord = dataclasses.replace(observations([], Outcome("PENDING", None, None, None), fm="ct", stopped_by="drained"), docs=())
    cte = RunReport("cte_ingestion/burst", "fixed", "ct", 1, [Check("CT1", True, "committed 1915")], no_chord, None, None, 15.0)
    return report.render([batch, later, cte], report.lessons_for([batch, later, cte]))


def test_a_case_study_cell_has_its_lesson_from_the_fixed_program_and_one_lane_per_chunk() -> None:
    lesson = report.lesson("severity_batch/batch")
    assert list(lesson.sections) == list(report.CASE_SECTIONS)
    page = _case_page()
    assert '<section class="fm" id="severity_batch/batch">' in page
    lanes = Outline(page).lanes[("severity_batch/batch", "fixed")]
    assert lanes == ["chunk000", "chunk001", "chunk002", "chunk003", "chunk004", "reconcile"]  # chunk004..007: one lane
    assert '<div class="lane" data-doc="chunk004" data-final="ok" data-reason="" data-docs="chunk004 chunk005 chunk006 chunk007">' in page
    assert '<span class="name">chunk004–chunk007 ×4</span>' in page
    assert "manifest: dispatched 2000" in page and "<h3>What the runs show</h3>" in page


def test_case_study_lanes_have_their_names_beside_the_plot_and_the_body_is_reconcile_without_emails() -> None:
    section = _case_page().split('<section class="fm" id="severity_batch/batch">')[1]
    fig = section.split('<figure class="timeline"')[1].split("</figure>")[0]
    for row in re.findall(r'<div class="lane" data-doc="[^"]*".*?</span></div>', fig):
        found = re.search(r'<span class="name">([^<]*)</span><span class="track">(<svg.*?</svg>)', row)
        assert found, row
        name, plot = found.groups()
        drawn = " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", plot))
        assert name and name not in drawn  # the name sits in its own column, never drawn over the plot
    assert '<span class="name">chunk001</span>' in fig
    body = re.search(r'<div class="lane" data-doc="reconcile" data-role="chord"[^>]*>.*?</div>', fig)
    assert body and '<b class="final" style="color:#2e7d32">ended ok</b>' in body.group(0)
    words = html_text.unescape(re.sub(r"<[^>]+>", " ", fig))
    assert "email" not in words and "notify" not in words  # emails are an FM notion; the body is reconcile
    assert "emails" not in section.split('<div class="timelines"')[1]  # nor a count of them, red or not


def test_a_case_study_with_no_chord_has_no_lanes_and_no_chord_state() -> None:
    cte = _case_page().split('<section class="fm" id="cte_ingestion/burst">')[1]
    assert "PENDING" not in cte and '<div class="lane"' not in cte
    assert f'<p class="note">{timeline_text.NO_CHORD}.</p>' in cte


def test_no_heading_ends_in_an_empty_colon() -> None:
    page = _case_page()
    headings = Outline(page).headings + Outline(report.render(_reports(), {})).headings
    assert headings and [h for h in headings if h.endswith(":")] == []
    assert ("severity_batch/dead_chunk severity_batch, scenario dead_chunk (the case study's lesson is under "
            "severity_batch/batch)") in headings


def test_fm4s_notify_story_reads_one_lane_per_delivery() -> None:
    html = report.render([RunReport("fm4", "fixed", "fm4", 4, [Check("G4", True, "emails 1")], notify_story_run())],
                         {"fm4": report.lesson("fm4")})
    lanes = Outline(html).lanes[("fm4", "fixed")]
    assert lanes == ["doc1", "doc2", "notify #1", "notify #2", "notify #3", "duplicate #1–5", "duplicate #6"]
    rows = dict(re.findall(r'<div class="lane" data-doc="((?:notify|duplicate)[^"]*)".*?<span class="what">(.*?)</span></div>', html))
    plain = {k: html_text.unescape(re.sub(r"<[^>]+>", "", v)) for k, v in rows.items()}
    assert plain == {
        "notify #1": "killed before sending · held at the runner's gate from 1.005s",
        "notify #2": "killed after sending · delivered again; email sent at 1.095s",
        "notify #3": "sent=True · delivered again; the mail API dropped its repeat (same key)",
        "duplicate #1–5": "claim busy ×5 · the scenario's second notify; each retried after 50 ms",
        "duplicate #6": "skipped · the claim said sent: returned sent=False",
    }
    lane2 = html.split('data-doc="notify #2"')[1].split("</div>")[0]
    assert "mark-email" in lane2 and "mark-killed" in lane2
    assert "mark-deduplicated" in html.split('data-doc="notify #3"')[1].split("</div>")[0]
    assert html.count('class="axis zoom"') == 1  # the deliveries crowd into 0.4 s of 1.4: their lanes zoom in


def _words(html: str) -> str:
    return " ".join(html_text.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _side_html(html: str, kind: str, tag: str) -> str:
    fig = html.split(f'<figure class="timeline" data-kind="{kind}">')[1].split("</figure>")[0]
    found = re.search(rf'<div class="(?:side|lane)"[^>]* data-side="{tag}".*?</span></div>', fig)
    assert found, (kind, tag)
    return found.group(0)


def test_a_completed_side_chord_is_one_line_of_words_with_its_marks(page: str) -> None:
    fm6 = page.split('<section class="fm" id="fm6">')[1]
    body = _side_html(fm6, "fixed", "body")
    assert body.startswith('<div class="side" data-doc="side body" data-side="body" data-state="SUCCESS" '
                           'data-body="dead_lettered"><span class="name">side body</span>')
    assert 'class="plot"' not in body and "mark-dead_lettered" in body
    assert _words(body) == ("side body chord SUCCESS (envelope FAILURE dead_lettered) · a poison notify: "
                            "body dead-lettered after 3 deliveries, finalised by the drain; claim released")
    expired = _side_html(fm6, "fixed", "expired")
    assert "mark-expired" in expired and "mark-revoked" in expired and "mark-email" in expired
    assert _words(expired) == ("side expired chord SUCCESS · a chain head sent already expired; doc31 failed: expired "
                               "(head REVOKED); doc34 failed: revoked (head REVOKED); email sent")
    assert _words(_side_html(fm6, "fixed", "behind")) == (
        f"side behind chord SUCCESS · a poison member behind {FOREIGN} letters no drain can place; all {FOREIGN} foreign "
        "letters parked; doc33 failed: dead_lettered; email sent")


def test_a_side_chord_that_did_not_complete_gets_a_lane_and_one_as_before_joins_the_as_above_line() -> None:
    weak = weak_sides_run()
    weak = dataclasses.replace(weak, sides={**weak.sides, "expired": fixed_sides()["expired"]})  # as in the fixed run
    fixed = dataclasses.replace(sided_run(), fm="fm3")
    html = report.render([RunReport("fm3", "fixed", "fm3", 3, [Check("G3", True, "held")], fixed),
                          RunReport("fm3", "weak", "fm3w", 3, [Check("S3 hard", True, "kept")], weak)], {})
    outline = Outline(html)
    assert outline.sides[("fm3", "weak")] == ["body", "behind"] and ("fm3", "weak") not in outline.side_lines
    assert outline.lanes[("fm3", "weak")][-2:] == ["side body", "side behind"]
    same = re.search(r'<div class="same" data-docs="doc2" data-sides="expired">.*?</div>', html)
    assert same and "doc2 and side expired: the same story as in the fixed run above" in _words(same.group(0))
    body = _side_html(html, "weak", "body")
    assert body.count("mark-killed") == 3 and body.count("mark-kept") == 2  # three deliveries killed; the letter kept
    assert _words(body).endswith("chord PENDING · a poison notify: body dead-lettered after 3 deliveries, kept in the DLQ in "
                                 "silence (not a chord member, 2 passes)")
    behind = _side_html(html, "weak", "behind")
    assert behind.count('class="attempt attempt-') == 3 and "mark-dead_lettered" not in behind
    assert _words(behind).endswith(f"chord PENDING · a poison member behind {FOREIGN} letters no drain can place; none of "
                                   f"{FOREIGN} foreign letters parked (DLQ: {FOREIGN + 3} ready at the end); doc33 never finalised by the drain")
    assert 'class="axis sides"' not in html  # no zoomed lanes above them: the run's own axis holds


def test_a_member_stored_as_failure_and_a_stalled_store_are_drawn_and_told() -> None:
    html = report.render([RunReport("fm6", "weak", "fm6w", 6, [Check("S6 hard", True, "FAILURE")], member_failure_run())], {})
    lanes = dict(re.findall(r'<div class="lane" data-doc="(doc\d+)"(.*?)</span></div>', html))
    assert 'data-final="member failure"' in lanes["doc11"] and 'data-final="member failure"' in lanes["doc28"]
    assert "mark-member_failure" in lanes["doc11"] and "mark-member_failure" in lanes["doc28"]
    assert "mark-running" not in lanes["doc11"]  # not still running: Celery recorded its end
    assert _words(lanes["doc11"]).endswith("member FAILURE · killed, then Celery stored TimeLimitExceeded outside the body")
    assert 'class="stall"' in lanes["doc28"] and "mark-store_stall" in lanes["doc28"]
    assert _words(lanes["doc28"]).endswith("member FAILURE · store stalled 1.0 s, then Celery stored SoftTimeLimitExceeded")
    ok = report.render([RunReport("fm6", "fixed", "fm6", 6, [], dataclasses.replace(observations(
        [start(0.1, "doc28", 1), ev(0.8, "store_stall", doc="doc28", seconds="1.0"), end(1.81, "doc28", 1)],
        summary_outcome(["doc28"], [])), docs=("doc28",)))], {})
    assert "ok · result store stalled 1.0 s" in _words(ok)




# ---- the handout: its size, its lanes and its print, measured in the browser -------------------------------


MEASURE = """<script>
window.addEventListener('load', () => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const out = {sections: {}, lanes: [], covered: [], svgs: []};
  for (const s of document.querySelectorAll('section.fm')) out.sections[s.id] = Math.round(s.getBoundingClientRect().height);
  for (const l of document.querySelectorAll('.lanes')) out.lanes.push(Math.round(l.getBoundingClientRect().width));
  for (const p of document.querySelectorAll('svg.plot')) out.svgs.push(Math.round(p.getBoundingClientRect().width));
  for (const row of document.querySelectorAll('div.lane')) {
    const name = box(row.querySelector('.name'));
    for (const m of row.querySelectorAll('.mark')) {
      const b = box(m);
      if (b[0] < name[2] && name[0] < b[2] && b[1] < name[3] && name[1] < b[3]) out.covered.push(row.dataset.doc);
    }
  }
  const pre = document.createElement('pre'); pre.id = 'measure'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
"""Added to a copy of the page (without its policy, which forbids scripts) to read its geometry."""


def _handout() -> str:
    """A report as a workshop gets it: FM-4's story (fixed, broken, hard variant), fm5, fm6, two case studies."""
    story = notify_story_run()
    runs = [RunReport("fm4", "fixed", "fm4", 4, [Check(f"G{i}", True, f"guarantee {i} held") for i in range(1, 5)], story),
            RunReport("fm4", "broken", "fm3", 4, [Check("S4", True, "emails 3 of 3 calls")], story),
            RunReport("fm4", "weak", "fm4w", 4, [Check("S4 hard", True, "emails 0")], story),
            *_reports(), _chunk_run(),
            RunReport("cte_ingestion/burst", "fixed", "ct", 1, [Check("CT1", True, "committed 1915")],
                      dataclasses.replace(observations([], Outcome("PENDING", None, None, None), fm="ct"), docs=()))]
    cells = ("fm4", "fm5", "fm6", "severity_batch/batch", "cte_ingestion/burst")
    return report.render(runs, {fm: report.lesson(fm) for fm in cells}, "generated by a test")


@pytest.fixture(scope="module")
def handout_file() -> Iterator[Path]:
    folder = ARTIFACTS / "report-test"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "handout.html"
    path.write_text(_handout(), encoding="utf-8")
    yield path


def measure(path: Path, width: int = SCREEN[0]) -> dict[str, Any]:
    """The page's geometry at ``width`` px, read by ``MEASURE`` in a copy of it."""
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", path.read_text(encoding="utf-8"))
    copy = path.with_name(path.stem + "-measured.html")
    copy.write_text(html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom, err = chromium(copy.as_uri(), f"--window-size={width},{SCREEN[1]}", "--virtual-time-budget=5000", "--dump-dom")
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run: {err[-2000:]}"
    return cast(dict[str, Any], json.loads(html_text.unescape(found.group(1))))


@pytest.mark.usefixtures("browser")
def test_each_fm_fits_about_two_screens_and_its_lanes_use_the_pages_width(handout_file: Path) -> None:
    seen = measure(handout_file)
    assert set(seen["sections"]) == {"fm4", "fm5", "fm6", "severity_batch/batch", "cte_ingestion/burst"}
    too_tall = {fm: h for fm, h in seen["sections"].items() if h > ABOUT_TWO_SCREENS}
    assert too_tall == {}, f"taller than about two screens of {SCREEN[0]} x {SCREEN[1]}: {too_tall}"
    # The old lanes were one SVG of 560 px, whatever the page's width: now a grid as wide as the section.
    assert "560" not in re.findall(r'<svg[^>]*width="(\d+)"', handout_file.read_text())
    assert seen["lanes"] and min(seen["lanes"]) >= SCREEN[0] - 120  # the section's width, less its margins
    assert min(seen["svgs"]) >= 500  # each plot: what the names and the words beside it leave (the old plot: 368 of 560)
    narrow = measure(handout_file, 900)
    assert max(narrow["lanes"]) <= 900 - 60 and max(narrow["svgs"]) < min(seen["svgs"])  # it follows the page


@pytest.mark.usefixtures("browser")
def test_a_lanes_name_never_covers_a_mark(handout_file: Path) -> None:
    seen = measure(handout_file)
    assert seen["covered"] == []
    assert len(seen["svgs"]) > 40  # the lanes were measured (plots plus axes)


@pytest.fixture
def pdftotext() -> Path:
    if not PDFTOTEXT.exists():
        why = f"{PDFTOTEXT} is missing: the print test reads the PDF with poppler's pdftotext (apt-get install -y poppler-utils)"
        if os.environ.get("RCL_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return PDFTOTEXT


@pytest.mark.usefixtures("browser")
def test_the_report_prints_with_its_details_and_an_fm_per_page(handout_file: Path, pdftotext: Path) -> None:
    printed = _css_rule(_handout(), "@media print")  # the rules up to the first closing brace
    assert "display:none" not in printed.replace(" ", "")
    pdf = handout_file.with_suffix(".pdf")
    pdf.unlink(missing_ok=True)
    chromium(handout_file.as_uri(), "--no-pdf-header-footer", f"--print-to-pdf={pdf}")
    assert pdf.read_bytes().startswith(b"%PDF")
    pages = subprocess.run([str(pdftotext), str(pdf), "-"], capture_output=True, text=True, timeout=60,
                           check=True).stdout.split("\f")
    text = " ".join(" ".join(pages).split())
    for words in ("G3 (poison dead-lettered at the bound; body; letters parked): holds", "S4 (duplicated notify: several emails): reproduced",
                  "body dead-lettered after 3 deliveries",
                  "killed before sending", "claim busy ×5", "the claim said sent: returned sent=False",
                  "chunk004–chunk007 ×4", "ended ok", "dead_lettered", "what happened", "Marks in these timelines"):
        assert words in text, f"{words!r} is not in the printed report"
    heads = [[ln.strip() for ln in page.splitlines() if ln.strip()][:4] for page in pages]  # a heading's words, in any order
    for fm in ("fm4", "fm5", "fm6", "severity_batch/batch", "cte_ingestion/burst"):  # each FM starts a page
        assert any(fm in head for head in heads), (fm, heads)
    if shutil.which("pdftoppm"):  # the pages as images, for a person to look at
        subprocess.run(["pdftoppm", "-r", "60", "-png", str(pdf), str(pdf.with_suffix(""))], timeout=120, check=True)


@pytest.mark.usefixtures("browser")
def test_fm4s_section_renders_to_a_screenshot_at_1280(handout_file: Path) -> None:
    shot = handout_file.with_suffix(".png")
    shot.unlink(missing_ok=True)
    chromium(handout_file.as_uri(), "--hide-scrollbars", f"--window-size={SCREEN[0]},{3 * SCREEN[1]}", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 50_000


def _large_runs() -> list[RunReport]:
    """A section as big as real fm6's: 30 documents (a burst of 16), the side chords, a broken run and a hard variant."""
    return [RunReport("fm6", "fixed", "fm6", 6, [Check(label, True, seen) for label, seen in LARGE_CHECKS.items()],
                      large_fixed_run(), seconds=13.5),
            RunReport("fm6", "broken", "fm5", 6, [Check("S6", True, LARGE_BROKEN_CHECK)], large_broken_run(), seconds=8.7),
            RunReport("fm6", "weak", "fm6w", 6, [Check("S6 hard", True, LARGE_WEAK_CHECK)], large_weak_run(), seconds=14.7)]


@pytest.fixture(scope="module")
def large_file() -> Iterator[Path]:
    folder = ARTIFACTS / "report-test"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "large.html"
    path.write_text(report.render(_large_runs(), {"fm6": report.lesson("fm6")}, "generated by a test"), encoding="utf-8")
    yield path


def test_a_big_run_tells_its_burst_in_one_lane_and_its_later_runs_only_what_differs() -> None:
    page = report.render(_large_runs(), {"fm6": report.lesson("fm6")})
    outline = Outline(page)
    burst = re.search(r'<div class="lane" data-doc="doc12"[^>]*data-docs="([^"]*)".*?<span class="what">(.*?)</span></div>', page)
    assert burst and burst.group(1).split() == list(BURST)
    assert _words(burst.group(0)).startswith("doc12–doc27 ×16")
    assert _words(burst.group(2)) == "ok · each: TransientError, retried after 1500 ms, then ok on attempt 2"
    assert outline.lanes[("fm6", "fixed")].count("doc12") == 1 and "doc13" not in outline.lanes[("fm6", "fixed")]
    assert outline.lanes[("fm6", "fixed")][-2:] == ["notify ×3", "duplicate ×6"]  # a big run: the body's deliveries, a lane a role
    # the broken run: what fm5's code changed; the documents it never reached, one line wherever they stand
    # the broken run: what fm5's code changed (two with one story share a lane); the documents it never reached,
    # one lane wherever they stand, named by number
    assert outline.lanes[("fm6", "broken")] == ["doc4", "doc5", "doc7", "doc8", "doc9", "doc10", "doc29", "notify"]
    pair = re.search(r'<div class="lane" data-doc="doc5"[^>]*data-docs="doc5 doc6".*?</span></div>', page)
    assert pair and _words(pair.group(0)).startswith("doc5, doc6")
    idle = re.search(r'<div class="lane" data-doc="doc10"[^>]*data-docs="([^"]*)".*?</span></div>', page)
    assert idle and idle.group(1).split() == ["doc10", "doc11", "doc28", "doc30", *BURST]
    assert _words(idle.group(0)).startswith("20 documents") and _words(idle.group(0)).endswith(
        "not started · doc10–doc28, doc30: no attempt began")
    # the hard variant: what neither earlier run tells
    assert outline.lanes[("fm6", "weak")] == ["doc11", "doc28", "doc30", "side expired", "side body"]  # unfinished: lanes
    assert outline.side_lines[("fm6", "weak")] == ["behind"]  # never sent: a line of words
    assert outline.same[("fm6", "weak")] == ["doc1", "doc2", "doc3", "doc7", "doc8", "doc9", "doc10",
                                             "doc4", "doc5", "doc6", "doc29", *BURST]
    weak_words = _words(page.split('data-kind="weak"')[-1])
    assert "member FAILURE · killed, then Celery stored TimeLimitExceeded" in weak_words
    assert ("doc4–doc6, doc12–doc27, doc29 and notify: the same story as in the broken run above"
            in _words(page.split('data-kind="weak"')[-1]))


def test_a_fetch_that_started_and_never_ended_is_a_hung_head() -> None:
    page = report.render(_large_runs()[:2], {})
    hung = re.search(r'<div class="lane" data-doc="doc29"(.*?)</span></div>', page.split('data-kind="broken"')[-1])
    assert hung and "mark-running" in hung.group(1) and 'data-final="running"' in hung.group(1)
    assert _words(hung.group(1)).endswith("fetch still running · hung head: its fetch never ended, no parse began")
    timeline_lines = [timeline_text.plain(ln) for ln in timeline_text.lines(timeline.build(large_broken_run()), "broken")]
    assert "  doc29 unfinished: fetch still running (hung head)" in timeline_lines
    fixed = timeline.build(large_fixed_run())
    assert next(d for d in fixed.docs if d.doc == "doc29").hung is False  # its fetch ended (hard_timeout): not hung
    assert next(d for d in timeline.build(large_broken_run()).docs if d.doc == "doc9").hung is False  # killed before: poison


@pytest.mark.usefixtures("browser")
def test_a_big_fm_section_fits_about_two_screens(large_file: Path) -> None:
    """Real fm6 measured 2,677 px before its burst shared a lane and its later runs said only what differs."""
    seen = measure(large_file)
    assert list(seen["sections"]) == ["fm6"]
    assert seen["sections"]["fm6"] <= ABOUT_TWO_SCREENS, f"fm6 is {seen['sections']['fm6']} px at {SCREEN[0]} px wide"
    assert min(seen["svgs"]) >= 500


# ---- FM-7..9: what the runner does from outside, drawn on the lanes it hits ------------------------------------------


LONG_NAMES = ("worker_cancel_long_running_tasks_on_connection_loss", "celery.backends.redis.RedisBackend.on_chord_part_return")


def _lesson_reports() -> list[RunReport]:
    """FM-6 to FM-9 as a workshop's handout has them: each fixed run as big as a real one, FM-9's broken run (the
    consumer timeout fires on fm8's code), checks as long as real ones, one of them naming the long settings."""
    checks = [Check(label, True, seen) for label, seen in LARGE_CHECKS.items()]
    names = f"{LONG_NAMES[0]} = True; {LONG_NAMES[1]} stored nothing"
    return [
        *_large_runs(),
        *(RunReport(f"fm{n}", "fixed", f"fm{n}", n, [*checks, *(Check(f"G{k}", True, names) for k in range(7, n + 1))],
                    lesson_run(n), seconds=30.0) for n in (7, 8, 9)),
        RunReport("fm9", "broken", "fm8", 9, [Check("S9", True, f"the linked worker exited: 1; {names}")],
                  lesson_run(9, broken=True), seconds=36.0),
    ]


@pytest.fixture(scope="module")
def lessons_page() -> str:
    runs = _lesson_reports()
    return report.render(runs, report.lessons_for(runs), "generated by a test")


def _block(page: str, fm: str, kind: str, tag: str) -> str:
    """A side chord's block of lanes in FM ``fm``'s figure of run ``kind``: from its axis to the figure's next block."""
    section = page.split(f'<section class="fm" id="{fm}">')[1].split("</section>")[0]
    figure = section.split(f'<figure class="timeline" data-kind="{kind}">')[1].split("</figure>")[0]
    return figure.split(f'<div class="axis block" data-side="{tag}">')[1].split('<div class="axis block"')[0]


def _what(lane: str) -> str:
    """What a lane says in words (its words' column)."""
    return _words(lane.split('<span class="what">')[-1])


def _lane(block: str, doc: str) -> str:
    found = re.search(rf'<div class="lane" data-doc="{re.escape(doc)}".*?</span></div>', block, re.S)
    assert found, f"no lane {doc}"
    return found.group(0)


def test_the_deploys_are_drawn_on_the_workers_they_stopped(lessons_page: str) -> None:
    block = _block(lessons_page, "fm7", "fixed", "deploy")
    lanes = re.findall(r'<div class="lane" data-doc="([^"]+)" data-worker', block)
    assert lanes == ["worker", "deploy1", "deploy2"]
    first, second, last = (_lane(block, w) for w in lanes)
    assert first.count("mark-sigterm") == 1 and first.count("mark-sigkill") == 1 and "mark-worker_up" not in first
    assert _what(first) == ("the run's worker · ran 3 attempts; SIGTERM 15.05s while running doc36, holding doc37 "
                             "unstarted; SIGKILL 0.50 s later: doc36 lost mid-body")
    assert second.count("mark-worker_up") == 1 and second.count("mark-worker_exit") == 1 and "mark-sigkill" not in second
    assert _what(second).endswith("up 15.00s · ran 3 attempts; SIGTERM 16.25s while running doc36, doc37; exited 0.45 s later")
    assert "mark-sigterm" not in last and _what(last).endswith("served to the end")
    # the work the SIGKILL lost, and the message the SIGTERM handed back unstarted, on their documents' lanes
    assert "mark-killed" in _lane(block, "doc36") and _lane(block, "doc37").count('class="delivered"') == 3
    fm7 = lessons_page.split('<section class="fm" id="fm7">')[1].split("</section>")[0]
    legend = set(re.findall(r'data-mark="(\w+)"', fm7.split('<div class="fm-legend">')[1].split("</div>")[0]))
    assert legend >= {"worker_up", "sigterm", "sigkill", "worker_exit", "delivered"}


def test_fm7s_own_lanes_are_fm6s_story_in_one_line_and_its_axis_the_main_chords(lessons_page: str) -> None:
    fm7 = lessons_page.split('<section class="fm" id="fm7">')[1].split("</section>")[0]
    fixed = fm7.split('<figure class="timeline" data-kind="fixed">')[1].split("</figure>")[0]
    assert Outline(lessons_page).lanes[("fm7", "fixed")][:1] == ["worker"]  # no lane before the deploys' block
    same = re.search(r'<div class="same"[^>]*>.*?</div>', fixed)
    assert same and "side expired, side body, side behind and notify: the same story as in the fixed run of fm6, in its " \
        "section" in _words(same.group(0))
    ticks = re.findall(r'<text x="[\d.]+%" y="12" text-anchor="middle">([\d.]+)</text>', fixed.split('class="axis block"')[0])
    assert ticks[-1] == "12"  # the main chord's 12.6 s, not the deploys' 18 s
    checks = fm7.split('<div class="cell" data-kind="fixed">')[1]
    assert '<li class="earlier"><span class="note">as in fm6\'s section:</span>' in checks


def test_the_outage_is_a_band_across_its_lanes(lessons_page: str) -> None:
    block = _block(lessons_page, "fm8", "fixed", "outage")
    lanes = re.findall(r'<div class="lane" data-doc="([^"]+)"', block)
    assert lanes and all(_lane(block, d).count("band-backend_down") == 2 for d in lanes)  # members, then notify
    assert "mark-error" in _lane(block, "doc67")  # its body ended ok, its store failed: it ran again
    assert "result backend down 4.01 s while members stored" in block
    fm8 = lessons_page.split('<section class="fm" id="fm8">')[1].split("</section>")[0]
    assert 'data-mark="backend_down"' in fm8.split('<div class="fm-legend">')[1].split("</div>")[0]


def test_the_cut_and_the_consumer_timeout_are_drawn_on_the_members_they_hit(lessons_page: str) -> None:
    cut = _block(lessons_page, "fm9", "fixed", "connloss")
    assert "mark-link_cut" in _lane(cut, "doc78") and "mark-link_cut" not in _lane(cut, "doc79")
    assert '<line class="cut"' in _lane(cut, "doc79")  # the cut's line crosses every lane of the side
    fixed = _lane(_block(lessons_page, "fm9", "fixed", "overlong"), "doc81")
    assert "mark-consumer_timeout" in fixed and '<line class="deadline"' in fixed and "not reached" in fixed
    broken = _block(lessons_page, "fm9", "broken", "overlong")
    assert "mark-worker_exit" in _lane(broken, "linked worker")
    assert "the broker closed the channel, its message back at 35.05s" in _lane(broken, "doc81")
    fm9 = lessons_page.split('<section class="fm" id="fm9">')[1].split("</section>")[0]
    legend = set(re.findall(r'data-mark="(\w+)"', fm9.split('<div class="fm-legend">')[1].split("</div>")[0]))
    assert legend >= {"link_cut", "consumer_timeout", "worker_exit"}


def test_no_stale_text(lessons_page: str) -> None:
    assert "G1..G6" not in lessons_page
    if not (ROOT / "DESIGN.md").exists():
        assert "DESIGN.md" not in lessons_page


def test_a_long_lesson_part_is_cut_in_whole_sentences_and_a_fix_names_every_setting() -> None:
    assert report.within("One two three. Four five six. Seven.", 4) == "One two three. …"
    assert report.within("- ``a``: one. Two three.\n- ``b``: four.", 3) == "- ``a``: one. …\n- ``b``: four."
    fix = report.within(report.lesson("fm9").sections["Fix"])
    assert all(name in fix for name in ("broker_channel_error_retry", LONG_NAMES[0], "within_consumer_timeout"))


MEASURE_FIT = """<script>
window.addEventListener('load', () => {
  const out = {sections: {}, wide: []};
  for (const s of document.querySelectorAll('section.fm')) out.sections[s.id] = Math.round(s.getBoundingClientRect().height);
  for (const e of document.querySelectorAll('body *')) {
    if (e.closest('svg') || e.id === 'measure' || e.clientWidth === 0) continue;
    if (e.scrollWidth > e.clientWidth + 1) out.wide.push(`${e.tagName.toLowerCase()}.${e.className} ${e.scrollWidth}>${e.clientWidth}: ${e.textContent.slice(0, 60)}`);
  }
  const pre = document.createElement('pre'); pre.id = 'measure'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
"""Each FM section's height and every element wider than its box (scrollWidth > clientWidth)."""


@pytest.fixture(scope="module")
def lessons_file(lessons_page: str) -> Iterator[Path]:
    folder = ARTIFACTS / "report-test"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "lessons.html"
    path.write_text(lessons_page, encoding="utf-8")
    yield path


def fit(path: Path, width: int = SCREEN[0]) -> dict[str, Any]:
    html = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", path.read_text(encoding="utf-8"))
    copy = path.with_name(path.stem + "-fit.html")
    copy.write_text(html.replace("</body>", MEASURE_FIT + "</body>"), encoding="utf-8")
    dom, err = chromium(copy.as_uri(), f"--window-size={width},{SCREEN[1]}", "--virtual-time-budget=5000", "--dump-dom")
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run: {err[-2000:]}"
    return cast(dict[str, Any], json.loads(html_text.unescape(found.group(1))))


@pytest.mark.usefixtures("browser")
def test_fm6_to_fm9_fit_two_screens_and_nothing_is_wider_than_its_box(lessons_file: Path) -> None:
    seen = fit(lessons_file)
    assert set(seen["sections"]) == {"fm6", "fm7", "fm8", "fm9"}
    too_tall = {fm: h for fm, h in seen["sections"].items() if h > ABOUT_TWO_SCREENS}
    assert too_tall == {}, f"taller than {ABOUT_TWO_SCREENS} px at {SCREEN[0]} px wide: {too_tall}"
    assert seen["wide"] == []


@pytest.mark.usefixtures("browser")
def test_the_printed_handout_has_both_columns(lessons_file: Path, pdftotext: Path) -> None:
    pdf = lessons_file.with_suffix(".pdf")
    pdf.unlink(missing_ok=True)
    chromium(lessons_file.as_uri(), "--no-pdf-header-footer", f"--print-to-pdf={pdf}")
    text = " ".join(subprocess.run([str(pdftotext), str(pdf), "-"], capture_output=True, text=True, timeout=60,
                                   check=True).stdout.split())
    left = ["SIGTERM", "+app.conf.worker_cancel_long_running_tasks_on_connection_loss = True"]  # the lanes, the change
    right = ["the linked worker exited: 1", "consumer_timeout", "served to the end", "what happened"]  # beside them
    assert [w for w in [*left, *right] if w not in text] == []
    if shutil.which("pdftoppm"):  # the pages as images, for a person to look at
        subprocess.run(["pdftoppm", "-r", "60", "-png", str(pdf), str(pdf.with_suffix(""))], timeout=120, check=True)
