"""The package version follows CHANGELOG.md (Keep a Changelog: dated versions, newest first)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import xrfm_torch

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def test_versions_are_dated_newest_first_and_the_package_version_follows():
    text = CHANGELOG.read_text()
    releases = RELEASE.findall(text)
    assert len(releases) >= 2
    versions = [tuple(map(int, r[:3])) for r in releases]
    dates = [datetime.date.fromisoformat(r[3]) for r in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert dates == sorted(dates, reverse=True)
    # every level-2 heading is a release or [Unreleased] (no undated "v10" or "(in progress)")
    headings = re.findall(r"^## .*$", text, re.M)
    assert all(h == "## [Unreleased]" or RELEASE.match(h) for h in headings), headings
    major, minor, patch = versions[0]
    unreleased = re.search(r"^## \[Unreleased\]\n(.*?)^## \[", text, re.M | re.S)
    if unreleased and unreleased.group(1).strip():
        assert xrfm_torch.__version__ == f"{major}.{minor + 1}.0.dev0"
    else:
        assert xrfm_torch.__version__ == f"{major}.{minor}.{patch}"
