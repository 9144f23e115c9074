"""``reliable-celery-audit``: audit a Celery app against every failure mode the lab proves.

    reliable-celery-audit myproject.celery:app                 # a table
    reliable-celery-audit myproject.celery:app --json          # JSON on stdout
    reliable-celery-audit myproject.celery:app --sarif -o audit.sarif   # SARIF 2.1.0 for code scanning
    reliable-celery-audit myproject.celery:app --chord-seconds 3600     # how long a chord of yours runs
    reliable-celery-audit myproject.celery:app --consumer-timeout 3600  # your RabbitMQ's consumer_timeout
    reliable-celery-audit --rules                              # the rules, their proof cells and fixes
    python -m audit myproject.celery:app                       # the same

It imports the app with every socket connection refused (``audit.guard``): no broker or backend
is needed, and none is contacted. The app is given as ``module:attribute``, or as ``module`` whose
``app`` or ``celery`` is taken, imported from the current folder as ``celery -A`` does.

Exit status: 0 when no finding is at or above ``--fail-on`` (default ``high``); 1 when one is;
2 when the app could not be imported or found (said in one line, no traceback) or the
arguments are wrong.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from audit.facts import RABBITMQ_CONSUMER_TIMEOUT_DEFAULT, AppLoadError, collect, load_app
from audit.output import as_json, as_sarif, table
from audit.rules import RULES, SEVERITIES, Options, run_rules

PROG = "reliable-celery-audit"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Audit a Celery app against the failure modes the lab proves "
                                "(no broker needed, none contacted).")
    p.add_argument("app", nargs="?", help="the app: module:attribute (myproject.celery:app), or a module")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the findings as JSON")
    fmt.add_argument("--sarif", action="store_true", help="print the findings as SARIF 2.1.0 (code scanning)")
    p.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the output to PATH, not stdout")
    p.add_argument("--fail-on", choices=SEVERITIES, default="high",
                   help="exit 1 when a finding is at or above this severity (default: high)")
    p.add_argument("--chord-seconds", type=float, metavar="S",
                   help="how long your longest chord runs; the chord-expiry rule needs it (configuration cannot say)")
    p.add_argument("--consumer-timeout", type=float, metavar="SECONDS", default=RABBITMQ_CONSUMER_TIMEOUT_DEFAULT,
                   help="your RabbitMQ's consumer_timeout, which Celery cannot read (default: RabbitMQ's, "
                   f"{RABBITMQ_CONSUMER_TIMEOUT_DEFAULT:g} s since 3.8.17)")
    p.add_argument("--rules", action="store_true", help="list the rules and exit")
    args = p.parse_args(argv)
    if not args.rules and not args.app:
        p.error("give the app to audit, e.g. myproject.celery:app (or --rules)")
    if args.chord_seconds is not None and args.chord_seconds <= 0:
        p.error("--chord-seconds takes a number of seconds above 0")
    if not args.consumer_timeout > 0:  # also refuses nan
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
        facts = collect(load_app(target), target)
    except AppLoadError as exc:
        print(f"{PROG}: cannot audit {target}: {exc}", file=sys.stderr)
        return 2
    findings = run_rules(facts, Options(chord_seconds=args.chord_seconds, consumer_timeout=args.consumer_timeout))
    text = as_json(facts, findings) if args.json else as_sarif(facts, findings) if args.sarif else table(facts, findings)
    if args.output is not None:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    floor = SEVERITIES.index(args.fail_on)
    return 1 if any(SEVERITIES.index(f.severity) >= floor for f in findings) else 0


if __name__ == "__main__":
    raise SystemExit(main())
