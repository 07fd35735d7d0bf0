"""Every result folder the docs, the result READMEs and the benchmark scripts cite is there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CITE = re.compile(r"bench/results/([A-Za-z0-9_.-]+)")


def cited(paths: list[Path]) -> set[str]:
    return {m.group(1) for p in paths for m in CITE.finditer(p.read_text())}


def test_every_cited_result_folder_exists():
    pages = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted(RESULTS.glob("*/README.md")),
        *sorted((ROOT / "bench").glob("*.py")),
        *sorted((ROOT / "tools").glob("*.py")),
    ]
    names = cited(pages)
    assert "regression-seeds0-2" in names  # the pattern finds the citations
    assert {n for n in names if not (RESULTS / n).exists()} == set()
