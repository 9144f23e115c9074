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

from audit.accept import Accepted, fingerprint
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


def repository_root(start: Path | None = None) -> Path:
    """The repository the audit runs in: the nearest folder up from ``start`` (the current one) holding ``.git``;
    else ``start`` itself. SARIF's paths are relative to it, as code scanning resolves them."""
    here = (start or Path(os.getcwd())).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def _relative(file: str | None, root: Path | None = None) -> str | None:
    if not file:
        return None
    path = Path(file).resolve()
    try:
        return path.relative_to(root or repository_root()).as_posix()
    except ValueError:
        return path.as_uri()


def _wrap(findings: list[Finding] | list[Accepted]) -> list[Accepted]:
    return [f if isinstance(f, Accepted) else Accepted(f, None, fingerprint(f)) for f in findings]


# ---- table ------------------------------------------------------------------------------


def table(facts: AppFacts, found: list[Finding] | list[Accepted], rules: tuple[Rule, ...] = RULES, width: int = 100,
          notes: list[str] | None = None) -> str:
    accepted = _wrap(found)
    findings = [a.finding for a in accepted if a.active]
    suppressed = [a for a in accepted if not a.active]
    n = counts(findings)
    lines = [
        f"{TOOL} {facts.target}",
        f"Celery {facts.celery_version}, kombu {facts.kombu_version}; broker {facts.broker_kind} "
        f"({mask(facts.broker_url)}), result backend {facts.backend_kind}; {len(facts.tasks)} task(s), "
        f"{len(facts.queues)} queue(s)",
        f"{len(rules)} rules checked: {len(findings)} finding(s), "
        + ", ".join(f"{v} {k}" for k, v in n.items())
        + (f"; {len(suppressed)} accepted (not counted)" if suppressed else ""),
    ]
    tail: list[str] = []
    for a in suppressed:
        tail += textwrap.wrap(f"accepted: {a.finding.rule.id} ({a.finding.where}): {a.suppression.justification} "
                              f"[{a.suppression.source}]" if a.suppression else "", width,
                              subsequent_indent="    ")
    for note in notes or []:
        tail += textwrap.wrap(f"cannot tell: {note}", width, subsequent_indent="    ")
    if not findings:
        lines.append("no exposure found")
        return "\n".join(lines + ([""] + tail if tail else [])) + "\n"
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
                            ("show it", f.rule.proof.command or "-"), ("fix", f.fix_here)):
            wrapped = textwrap.wrap(text, width - 12) or ["-"]
            lines.append(f"   {label + ':':<9}{wrapped[0]}")
            lines.extend(f"   {'':<9}{w}" for w in wrapped[1:])
    return "\n".join(lines + ([""] + tail if tail else [])) + "\n"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# ---- JSON -------------------------------------------------------------------------------


def finding_json(facts: AppFacts, f: Finding, root: Path | None = None) -> dict[str, Any]:
    return {
        "rule": f.rule.id, "title": f.rule.title, "origin": f.rule.origin, "severity": f.severity,
        "where": f.where, "tasks": list(f.tasks), "queue": f.queue, "setting": f.setting,
        "consequence": f.consequence,
        "proof": {"cell": f.rule.proof.cell, "command": f.rule.proof.command, "versions": list(f.rule.proof.versions),
                  "here": f.rule.proof_here(facts)},
        "fix": f.fix_here, "file": _relative(f.file, root), "line": f.line,
    }


def as_json(facts: AppFacts, found: list[Finding] | list[Accepted], rules: tuple[Rule, ...] = RULES,
            notes: list[str] | None = None) -> str:
    accepted = _wrap(found)
    findings = [a.finding for a in accepted if a.active]
    root = repository_root()
    items: list[dict[str, Any]] = []
    for a in accepted:
        item = finding_json(facts, a.finding, root)
        item["fingerprint"] = a.fingerprint
        item["suppressed"] = (None if a.suppression is None else
                              {"kind": a.suppression.kind, "justification": a.suppression.justification,
                               "source": a.suppression.source})
        items.append(item)
    doc = {
        "tool": TOOL, "app": facts.target, "celery": facts.celery_version, "kombu": facts.kombu_version,
        "broker": {"kind": facts.broker_kind, "url": mask(facts.broker_url)},
        "backend": {"kind": facts.backend_kind, "url": mask(facts.backend_url)},
        "tasks": [t.name for t in facts.tasks], "queues": sorted(facts.queues),
        "rules_checked": [r.id for r in rules], "counts": counts(findings),
        "suppressed_count": len(accepted) - len(findings),
        "findings": items, "cannot_tell": list(notes or []),
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
        return importlib.metadata.version("reliable-celery-audit")
    except importlib.metadata.PackageNotFoundError:
        try:
            return importlib.metadata.version("reliable-celery-lab")
        except importlib.metadata.PackageNotFoundError:
            return "0+unknown"


def as_sarif(facts: AppFacts, found: list[Finding] | list[Accepted], rules: tuple[Rule, ...] = RULES,
             notes: list[str] | None = None, baseline_used: bool = False) -> str:
    """SARIF 2.1.0. Paths are relative to the repository's root (``SRCROOT``); an accepted finding is a result
    with ``suppressions`` (kind ``external``, status ``accepted``, its justification); with a baseline, each
    result says ``baselineState`` (``unchanged`` for a baselined one, ``new`` otherwise)."""
    index = {r.id: i for i, r in enumerate(rules)}
    root = repository_root()
    results: list[dict[str, Any]] = []
    for a in _wrap(found):
        f = a.finding
        result: dict[str, Any] = {
            "ruleId": f.rule.id, "ruleIndex": index[f.rule.id], "level": LEVEL[f.severity],
            "message": {"text": f"{f.where}: {f.consequence} Proof: {f.rule.proof_here(facts)}. Fix: {f.fix_here}."},
            "partialFingerprints": {"reliableCeleryAudit/v1": a.fingerprint},
            "properties": {"severity": f.severity, "tasks": list(f.tasks), "queue": f.queue, "setting": f.setting},
        }
        uri = _relative(f.file, root)
        if uri:
            location: dict[str, Any] = {"uri": uri}
            if not uri.startswith("file:"):
                location["uriBaseId"] = "SRCROOT"
            result["locations"] = [{"physicalLocation": {"artifactLocation": location,
                                                         "region": {"startLine": max(1, f.line or 1)}}}]
        if a.suppression is not None:
            result["suppressions"] = [{"kind": a.suppression.kind, "status": "accepted",
                                       "justification": a.suppression.justification,
                                       "properties": {"source": a.suppression.source}}]
        if baseline_used:
            result["baselineState"] = "unchanged" if a.suppression and a.suppression.source.startswith("baseline") \
                else "new"
        results.append(result)
    doc = {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": TOOL, "version": tool_version(),  # the rules' page: docs/audit.md
                                "rules": [_rule_sarif(r) for r in rules]}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root.as_uri() + "/"}},
            "properties": {"app": facts.target, "celery": facts.celery_version, "kombu": facts.kombu_version,
                           "broker": facts.broker_kind, "backend": facts.backend_kind, "cannotTell": list(notes or [])},
            "results": results,
        }],
    }
    return json.dumps(doc, indent=2) + "\n"
