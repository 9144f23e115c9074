"""Variants of an FM program, made by editing its source, for runs that prove a claim.

``derive("<short>_<what>", "<short>t_backstop_only", [("@hard_timeout(1.5)...\\n", "")])``
writes ``.lab/variants/<short>t_backstop_only.py``: the FM's file with that one line
removed, in a namespace of its own (``<short>t``, from the new name). A variant is
the FM minus (or plus) exactly the edit, so the run shows what that edit does.
Each edit must match exactly once, or ``ValueError`` says which did not.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.fm import ROOT, Fm, load_module

VARIANTS_DIR = ROOT / ".lab" / "variants"


def derive(base: str, name: str, edits: Sequence[tuple[str, str]]) -> Fm:
    source = (ROOT / f"{base}.py").read_text()
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"{base}: {old!r} occurs {source.count(old)} times, not once")
        source = source.replace(old, new)
    VARIANTS_DIR.mkdir(parents=True, exist_ok=True)
    (VARIANTS_DIR / f"{name}.py").write_text(source)
    return load_module(name, VARIANTS_DIR)
