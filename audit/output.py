"""The audit's three outputs: a table for a terminal, JSON, and SARIF 2.1.0 for code scanning in CI.

SARIF is plain JSON written with the standard library: one run, the tool's rules (every rule of
the catalogue, so a CI dashboard can show what was checked), one result per finding with its
level (high: error, medium: warning, low: note), its message (the consequence, the proof and the
fix) and its location (the task's function, or the line of the app's module that names the setting;
paths relative to the folder the audit ran in when they are under it).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from audit.facts import AppFacts
from audit.rules import RULES, SEVERITIES, Finding, Rule

TOOL = "reliable-celery-audit"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"high": "error", "medium": "warning", "low": "note"}


def mask(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def counts(findings: list[Finding]) -> dict[str, int]:
    return {s: sum(1 for f in findings if f.severity == s) for s in reversed(SEVERITIES)}


def _relative(file: str | None) -> str | None:
    if not file:
        return None
    path = Path(file).resolve()
    try:
        return path.relative_to(Path(os.getcwd()).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


# ---- table ------------------------------------------------------------------------------


def table(facts: AppFacts, findings: list[Finding], rules: tuple[Rule, ...] = RULES, width: int = 100) -> str:
    n = counts(findings)
    lines = [
        f"{TOOL} {facts.target}",
        f"Celery {facts.celery_version}, kombu {facts.kombu_version}; broker {facts.broker_kind} "
        f"({mask(facts.broker_url)}), result backend {facts.backend_kind}; {len(facts.tasks)} task(s), "
        f"{len(facts.queues)} queue(s)",
        f"{len(rules)} rules checked: {len(findings)} finding(s), "
        + ", ".join(f"{v} {k}" for k, v in n.items()),
    ]
    if not findings:
        lines.append("no exposure found")
        return "\n".join(lines) + "\n"
    rows = [("SEVERITY", "RULE", "WHERE", "PROVEN BY")]
    rows += [(f.severity.upper(), f.rule.id, _short(f.where.split(" (", 1)[0], 60), f.rule.proof.cell or "read, no lab run")
             for f in findings]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines.append("")
    for r in rows:
        lines.append("  ".join(c.ljust(widths[i]) if i < 3 else c for i, c in enumerate(r)).rstrip())
    for i, f in enumerate(findings, 1):
        lines.append("")
        lines.append(f"{i}. {f.severity.upper()} {f.rule.id}: {f.rule.title} ({f.rule.origin})")
        for label, text in (("where", f.where + (f": {', '.join(f.tasks)}" if len(f.tasks) > 1 else "")),
                            ("what", f.consequence), ("proof", f.rule.proof_here(facts)),
                            ("show it", f.rule.proof.command or "-"), ("fix", f.rule.fix)):
            wrapped = textwrap.wrap(text, width - 12) or ["-"]
            lines.append(f"   {label + ':':<9}{wrapped[0]}")
            lines.extend(f"   {'':<9}{w}" for w in wrapped[1:])
    return "\n".join(lines) + "\n"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# ---- JSON -------------------------------------------------------------------------------


def finding_json(facts: AppFacts, f: Finding) -> dict[str, Any]:
    return {
        "rule": f.rule.id, "title": f.rule.title, "origin": f.rule.origin, "severity": f.severity,
        "where": f.where, "tasks": list(f.tasks), "queue": f.queue, "setting": f.setting,
        "consequence": f.consequence,
        "proof": {"cell": f.rule.proof.cell, "command": f.rule.proof.command, "versions": list(f.rule.proof.versions),
                  "here": f.rule.proof_here(facts)},
        "fix": f.rule.fix, "file": _relative(f.file), "line": f.line,
    }


def as_json(facts: AppFacts, findings: list[Finding], rules: tuple[Rule, ...] = RULES) -> str:
    doc = {
        "tool": TOOL, "app": facts.target, "celery": facts.celery_version, "kombu": facts.kombu_version,
        "broker": {"kind": facts.broker_kind, "url": mask(facts.broker_url)},
        "backend": {"kind": facts.backend_kind, "url": mask(facts.backend_url)},
        "tasks": [t.name for t in facts.tasks], "queues": sorted(facts.queues),
        "rules_checked": [r.id for r in rules], "counts": counts(findings),
        "findings": [finding_json(facts, f) for f in findings],
    }
    return json.dumps(doc, indent=2) + "\n"


# ---- SARIF ------------------------------------------------------------------------------


def _rule_sarif(r: Rule) -> dict[str, Any]:
    proof = r.proof.cell or f"no lab run proves it yet ({r.proof.note})"
    return {
        "id": r.id, "name": r.id.replace("-", " "),
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": f"{r.title} ({r.origin}). Proven by: {proof}."},
        "help": {"text": f"Fix: {r.fix}. Show it: {r.proof.command or '-'}"},
        "defaultConfiguration": {"level": LEVEL[r.severity]},
        "properties": {"origin": r.origin, "severity": r.severity, "proof": r.proof.cell},
    }


def tool_version() -> str:
    """This project's version, as installed (the SARIF driver's ``version``)."""
    try:
        return importlib.metadata.version("reliable-celery-lab")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def as_sarif(facts: AppFacts, findings: list[Finding], rules: tuple[Rule, ...] = RULES) -> str:
    index = {r.id: i for i, r in enumerate(rules)}
    results: list[dict[str, Any]] = []
    for f in findings:
        result: dict[str, Any] = {
            "ruleId": f.rule.id, "ruleIndex": index[f.rule.id], "level": LEVEL[f.severity],
            "message": {"text": f"{f.where}: {f.consequence} Proof: {f.rule.proof_here(facts)}. Fix: {f.rule.fix}."},
            "properties": {"severity": f.severity, "tasks": list(f.tasks), "queue": f.queue, "setting": f.setting},
        }
        uri = _relative(f.file)
        if uri:
            result["locations"] = [{"physicalLocation": {"artifactLocation": {"uri": uri},
                                                         "region": {"startLine": max(1, f.line or 1)}}}]
        results.append(result)
    doc = {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": TOOL, "version": tool_version(),  # the rules' page: docs/audit.md
                                "rules": [_rule_sarif(r) for r in rules]}},
            "properties": {"app": facts.target, "celery": facts.celery_version, "kombu": facts.kombu_version,
                           "broker": facts.broker_kind, "backend": facts.backend_kind},
            "results": results,
        }],
    }
    return json.dumps(doc, indent=2) + "\n"
