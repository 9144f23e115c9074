"""``reliable-celery-audit``: audit a Celery app against every failure mode the lab proves.

    reliable-celery-audit myproject                            # the app as `celery -A myproject` finds it
    reliable-celery-audit myproject.celery:app --json          # JSON on stdout
    reliable-celery-audit myproject --sarif -o audit.sarif     # SARIF 2.1.0 for code scanning
    reliable-celery-audit myproject --chord-gap 600            # the longest stretch a chord goes with no return
    reliable-celery-audit myproject --consumer-timeout 3600    # your RabbitMQ's consumer_timeout
    reliable-celery-audit myproject --write-baseline audit-baseline.json   # accept today's findings
    reliable-celery-audit myproject --baseline audit-baseline.json         # fail on new ones only
    reliable-celery-audit --rules                              # the rules, their proof cells and fixes
    python -m audit myproject                                  # the same

It imports the app with every socket connection refused (``audit.guard``): no broker or backend
is needed, and none is contacted. The app is found as ``celery -A`` finds it
(``celery.app.utils.find_app``): ``module:attribute``, or a module whose ``app``, then ``celery``, then
(for a package) whose ``celery`` submodule's app, then any Celery app it holds, is taken; imported from
the current folder. Options may also come from ``[tool.reliable-celery-audit]`` in the project's
``pyproject.toml`` (``audit.accept``), which holds the ignores, each with its reason.

Exit status: 0 when no finding that is not accepted is at or above ``--fail-on`` (default ``high``;
``never`` never fails); 1 when one is; 2 when the app could not be imported, found or read, the
configuration or baseline cannot be used, or the arguments are wrong (said in one line, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from audit.accept import FAIL_ON, ConfigError, accept, baseline_text, find_pyproject, load_config, read_baseline
from audit.facts import RABBITMQ_CONSUMER_TIMEOUT_DEFAULT, AppLoadError, collect, load_app
from audit.output import as_json, as_sarif, table
from audit.rules import RULES, SEVERITIES, Options, cannot_tell, run_rules

PROG = "reliable-celery-audit"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Audit a Celery app against the failure modes the lab proves "
                                "(no broker needed, none contacted).")
    p.add_argument("app", nargs="?", help="the app as celery -A takes it: a module (myproject), or module:attribute")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the findings as JSON")
    fmt.add_argument("--sarif", action="store_true", help="print the findings as SARIF 2.1.0 (code scanning)")
    p.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the output to PATH, not stdout")
    p.add_argument("--fail-on", choices=FAIL_ON, default=None,
                   help="exit 1 when a finding not accepted is at or above this severity; never: exit 0 whatever is "
                   "found (default: pyproject's fail-on, else high)")
    p.add_argument("--chord-gap", type=float, metavar="S",
                   help="the longest stretch a chord of yours goes with no member returning (from its dispatch to the "
                   "first return, or between two): the chord-expiry rule needs it, configuration cannot say")
    p.add_argument("--consumer-timeout", type=float, metavar="SECONDS", default=None,
                   help="your RabbitMQ's consumer_timeout, which Celery cannot read (default: pyproject's, else "
                   f"RabbitMQ's, {RABBITMQ_CONSUMER_TIMEOUT_DEFAULT:g} s since 3.8.17)")
    p.add_argument("--config", type=Path, metavar="PYPROJECT",
                   help="the pyproject.toml to read [tool.reliable-celery-audit] from (default: the nearest one)")
    p.add_argument("--baseline", type=Path, metavar="PATH", help="accept the findings this baseline records")
    p.add_argument("--write-baseline", type=Path, metavar="PATH",
                   help="write today's findings not otherwise accepted to PATH as a baseline, then report as usual")
    p.add_argument("--rules", action="store_true", help="list the rules and exit")
    args = p.parse_args(argv)
    if not args.rules and not args.app:
        p.error("give the app to audit, e.g. myproject or myproject.celery:app (or --rules)")
    if args.chord_gap is not None and not args.chord_gap > 0:
        p.error("--chord-gap takes a number of seconds above 0")
    if args.consumer_timeout is not None and not args.consumer_timeout > 0:  # also refuses nan
        p.error("--consumer-timeout takes a number of seconds above 0")
    return args


def rules_text() -> str:
    lines: list[str] = []
    for r in RULES:
        since = f", Celery {r.since[0]}.{r.since[1]}+" if r.since else ""
        lines.append(f"{r.id} [{r.severity}{since}] {r.title} ({r.origin})")
        lines.append(f"    proof: {r.proof.cell or 'no lab run proves it yet'}"
                     + (f" on Celery {', '.join(r.proof.versions)}" if r.proof.cell else f" ({r.proof.note})"))
        lines.append(f"    show it: {r.proof.command or '-'}")
        lines.append(f"    fix: {r.fix}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rules:
        sys.stdout.write(rules_text())
        return 0
    target = str(args.app)
    try:
        config = load_config(args.config if args.config is not None else find_pyproject(Path.cwd()))
        baseline_path = args.baseline or config.baseline
        baseline = read_baseline(baseline_path) if baseline_path is not None else None
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        facts = collect(load_app(target), target)
    except AppLoadError as exc:
        print(f"{PROG}: cannot audit {target}: {exc}", file=sys.stderr)
        return 2
    options = Options(chord_gap=args.chord_gap if args.chord_gap is not None else config.chord_gap,
                      consumer_timeout=args.consumer_timeout or config.consumer_timeout
                      or RABBITMQ_CONSUMER_TIMEOUT_DEFAULT)
    findings = run_rules(facts, options)
    notes = cannot_tell(facts, options)
    accepted = accept(findings, config, baseline, str(baseline_path or ""))
    if args.write_baseline is not None:
        try:
            args.write_baseline.write_text(baseline_text(a.finding for a in accepted
                                                         if a.active or (a.suppression and
                                                                         a.suppression.source.startswith("baseline"))),
                                           encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: cannot write {args.write_baseline}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    text = (as_json(facts, accepted, notes=notes) if args.json else
            as_sarif(facts, accepted, notes=notes, baseline_used=baseline is not None) if args.sarif else
            table(facts, accepted, notes=notes))
    if args.output is not None:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    fail_on = args.fail_on or config.fail_on or "high"
    if fail_on == "never":
        return 0
    floor = SEVERITIES.index(fail_on)  # type: ignore[arg-type]
    return 1 if any(SEVERITIES.index(a.finding.severity) >= floor for a in accepted if a.active) else 0


if __name__ == "__main__":
    raise SystemExit(main())
