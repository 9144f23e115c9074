"""Accepting a finding: ignores with a reason from the project's ``pyproject.toml``, and a baseline file.

The project's ``pyproject.toml`` (the nearest one from the folder the audit runs in, up to the repository's
root, as ruff, mypy and bandit find theirs) may hold::

    [tool.reliable-celery-audit]
    fail-on = "high"                 # or "medium", "low", "never"
    consumer-timeout = 3600          # your RabbitMQ's, in seconds
    chord-gap = 600                  # the longest stretch a chord of yours goes with no member returning
    baseline = "audit-baseline.json" # findings accepted as they are today

    [[tool.reliable-celery-audit.ignore]]
    rule = "acks-early"
    reason = "every task is idempotent and re-sent by the nightly reconciliation"

    [[tool.reliable-celery-audit.ignore]]
    rule = "time-limit-fails-chord"
    tasks = ["proj.tasks.render"]     # only these tasks of the rule's finding
    reason = "a render past its limit must fail the chord"

An ignore without a ``reason`` is refused (exit 2): accepting a finding is a decision someone must be able to
read. An ignored or baselined finding is not counted by ``--fail-on``, and it stays in the JSON (``suppressed``)
and the SARIF (``suppressions``, SARIF 2.1.0 section 3.27.23), so a dashboard shows what was accepted and why.

A baseline records each finding's fingerprint: its rule, its tasks, queue and setting, never a line number,
so that editing a file moves no finding out of it. ``--write-baseline PATH`` writes today's findings;
``--baseline PATH`` (or ``baseline =``) suppresses those and lets CI fail on new ones only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from audit.rules import RULES_BY_ID, SEVERITIES, Finding

TABLE = "reliable-celery-audit"
FAIL_ON = (*SEVERITIES, "never")


class ConfigError(Exception):
    """The project's configuration or baseline cannot be used; the message says why, in one line."""


@dataclass(frozen=True)
class Suppression:
    kind: str  # SARIF's: "external" (a pyproject.toml ignore or a baseline)
    justification: str
    source: str  # "pyproject.toml ignore" or "baseline audit-baseline.json"


@dataclass(frozen=True)
class Ignore:
    rule: str
    tasks: tuple[str, ...]  # () for the whole finding
    reason: str


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    ignores: tuple[Ignore, ...] = ()
    fail_on: str | None = None
    consumer_timeout: float | None = None
    chord_gap: float | None = None
    baseline: Path | None = None


@dataclass(frozen=True)
class Accepted:
    finding: Finding
    suppression: Suppression | None
    fingerprint: str

    @property
    def active(self) -> bool:
        return self.suppression is None


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` from ``start`` up to the repository's root (a folder holding ``.git``)."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
        if (folder / ".git").exists():
            return None
    return None


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    raw: Any = cast(dict[str, Any], doc.get("tool", {})).get(TABLE, {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [tool.{TABLE}] is not a table")
    table = cast(dict[str, Any], raw)
    known = {"fail-on", "consumer-timeout", "chord-gap", "baseline", "ignore"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{path}: [tool.{TABLE}] has no key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
    ignores: list[Ignore] = []
    for i, entry in enumerate(cast(list[Any], table.get("ignore", []) or [])):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: ignore #{i + 1} is not a table")
        e = cast(dict[str, Any], entry)
        rule, reason = e.get("rule"), e.get("reason")
        if not isinstance(rule, str) or rule not in RULES_BY_ID:
            raise ConfigError(f"{path}: ignore #{i + 1} names no rule of the audit ({rule!r}; see --rules)")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"{path}: ignore #{i + 1} ({rule}) has no reason: say why the finding is accepted")
        tasks = e.get("tasks", [e["task"]] if "task" in e else [])
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in cast(list[Any], tasks)):
            raise ConfigError(f"{path}: ignore #{i + 1} ({rule}): tasks must be a list of task names")
        ignores.append(Ignore(rule, tuple(cast(list[str], tasks)), reason.strip()))
    fail_on = table.get("fail-on")
    if fail_on is not None and fail_on not in FAIL_ON:
        raise ConfigError(f"{path}: fail-on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
    numbers: dict[str, float | None] = {}
    for key in ("consumer-timeout", "chord-gap"):
        value = table.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
            raise ConfigError(f"{path}: {key} takes a number of seconds above 0, not {value!r}")
        numbers[key] = float(value) if value is not None else None
    baseline = table.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ConfigError(f"{path}: baseline takes a path")
    return Config(path, tuple(ignores), cast(str | None, fail_on), numbers["consumer-timeout"], numbers["chord-gap"],
                  (path.parent / baseline) if baseline else None)


def fingerprint(f: Finding) -> str:
    """What stays the same while the finding does: its rule, tasks, queue and setting (no line, no wording)."""
    key = json.dumps([f.rule.id, sorted(f.tasks), f.queue, f.setting])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def read_baseline(path: Path) -> set[str]:
    try:
        doc: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no baseline at {path} (write one with --write-baseline {path})") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the baseline {path}: {exc}") from None
    items = cast(dict[str, Any], doc).get("findings") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ConfigError(f"{path} is no baseline of {TABLE} (no findings list)")
    return {str(cast(dict[str, Any], i).get("fingerprint")) for i in cast(list[Any], items) if isinstance(i, dict)}


def baseline_text(findings: Iterable[Finding]) -> str:
    """A baseline of ``findings``: their fingerprints, with the rule and tasks so a reviewer can read it."""
    items = [{"fingerprint": fingerprint(f), "rule": f.rule.id, "tasks": sorted(f.tasks), "queue": f.queue,
              "setting": f.setting} for f in findings]
    return json.dumps({"tool": TABLE, "version": 1, "findings": sorted(items, key=lambda i: (i["rule"], i["fingerprint"]))},
                      indent=2) + "\n"


def accept(findings: list[Finding], config: Config, baseline: set[str] | None = None,
           baseline_name: str = "") -> list[Accepted]:
    """Each finding with its suppression, if accepted. A task ignore that covers some of a finding's tasks splits
    it: the accepted tasks as a suppressed finding, the others as an active one."""
    out: list[Accepted] = []
    for f in findings:
        whole = next((i for i in config.ignores if i.rule == f.rule.id and not i.tasks), None)
        if whole is not None:
            out.append(Accepted(f, Suppression("external", whole.reason, "pyproject.toml ignore"), fingerprint(f)))
            continue
        by_task = {t: i for i in config.ignores if i.rule == f.rule.id for t in i.tasks if t in f.tasks}
        rest = f
        if by_task:
            ignored = tuple(t for t in f.tasks if t in by_task)
            reasons = "; ".join(dict.fromkeys(by_task[t].reason for t in ignored))
            part = dataclasses.replace(f, tasks=ignored, where=f"{f.where} [accepted: {', '.join(ignored)}]")
            out.append(Accepted(part, Suppression("external", reasons, "pyproject.toml ignore"), fingerprint(part)))
            kept = tuple(t for t in f.tasks if t not in by_task)
            if not kept:
                continue
            rest = dataclasses.replace(f, tasks=kept)
        fp = fingerprint(rest)
        if baseline is not None and fp in baseline:
            out.append(Accepted(rest, Suppression("external", f"accepted in the baseline {baseline_name}",
                                                  f"baseline {baseline_name}"), fp))
        else:
            out.append(Accepted(rest, None, fp))
    return out
