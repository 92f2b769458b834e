#!/usr/bin/env python3
"""The release rules (docs/release.md), checked: run by the release workflow and the tests.

    python scripts/release_check.py                 # the checkout is consistent
    python scripts/release_check.py --tag v0.2.0    # ... and may be released as this tag
    python scripts/release_check.py --notes 0.2.0   # print that version's CHANGELOG section

Checks: the package version (exporter/_version.py) is X.Y.Z and the chart's appVersion; the chart
version is SemVer; CHANGELOG.md opens with `## [Unreleased]` or the current version's section. With
--tag: the tag is v<package version>, CHANGELOG.md has `## [<version>] - YYYY-MM-DD`, and against the
previous v* tag (git) the package version went up and, if anything under the chart changed (its
appVersion included), so did the chart version. On success prints `version=...` and
`chart_version=...` (for $GITHUB_OUTPUT); each broken rule is one line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = "helm/kube-gpu-exporter"
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
RELEASE = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\S+))?[ \t]*$", re.M)


def package_version(text: str) -> str:
    """The ``__version__ = "..."`` literal of exporter/_version.py's text."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return node.value.value
    raise ValueError("no __version__ literal")


def chart_field(text: str, key: str) -> str:
    """A top-level scalar of Chart.yaml (plain or quoted), without a YAML library."""
    m = re.search(rf"^{key}:[ \t]*(['\"]?)([^'\"\n#]+?)\1[ \t]*(?:#.*)?$", text, re.M)
    if not m:
        raise ValueError(f"Chart.yaml has no {key}")
    return m.group(2)


def sections(changelog: str) -> list[tuple[str, str | None]]:
    return [(m.group("name"), m.group("date")) for m in SECTION.finditer(changelog)]


def notes(changelog: str, version: str) -> str:
    """The body of ``version``'s section."""
    found = list(SECTION.finditer(changelog))
    for i, m in enumerate(found):
        if m.group("name") == version:
            end = found[i + 1].start() if i + 1 < len(found) else len(changelog)
            body = changelog[m.end():end]
            return re.sub(r"^\[[^\]]+\]: .*$", "", body, flags=re.M).strip() + "\n"
    raise ValueError(f"CHANGELOG.md has no section for {version}")


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def previous_tag(root: Path, tag: str) -> str | None:
    """The newest v* tag that is an ancestor of ``tag``'s commit and not ``tag`` itself."""
    proc = git(root, "describe", "--tags", "--abbrev=0", "--match", "v*", f"{tag}^")
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def check(root: Path, tag: str | None = None) -> tuple[dict[str, str], list[str]]:
    errors: list[str] = []
    version = package_version((root / "exporter" / "_version.py").read_text())
    chart = (root / CHART_DIR / "Chart.yaml").read_text()
    chart_version, app_version = chart_field(chart, "version"), chart_field(chart, "appVersion")
    if not RELEASE.fullmatch(version):
        errors.append(f"package version {version!r} is not X.Y.Z")
    if app_version != version:
        errors.append(f"Chart.yaml appVersion {app_version!r} is not the package version {version!r}")
    if not SEMVER.fullmatch(chart_version):
        errors.append(f"Chart.yaml version {chart_version!r} is not SemVer")
    changelog = (root / "CHANGELOG.md").read_text()
    heads = sections(changelog)
    if not heads or heads[0][0] not in ("Unreleased", version):
        errors.append(f"CHANGELOG.md must open with ## [Unreleased] or ## [{version}]")
    if tag is not None:
        if tag != f"v{version}":
            errors.append(f"tag {tag!r} is not v<package version> (v{version})")
        dated = dict(heads).get(version)
        if not dated or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", dated):
            errors.append(f"CHANGELOG.md has no '## [{version}] - YYYY-MM-DD' section")
        prev = previous_tag(root, tag)
        if prev:
            errors += against_previous(root, prev, version, chart_version)
    return {"version": version, "chart_version": chart_version}, errors


def against_previous(root: Path, prev: str, version: str, chart_version: str) -> list[str]:
    from packaging.version import Version

    errors = []
    old = package_version(git(root, "show", f"{prev}:exporter/_version.py").stdout)
    if Version(version) <= Version(old):
        errors.append(f"package version {version} is not above {old} of {prev}")
    old_chart = chart_field(git(root, "show", f"{prev}:{CHART_DIR}/Chart.yaml").stdout, "version")
    changed = git(root, "diff", "--quiet", prev, "HEAD", "--", CHART_DIR).returncode != 0
    if changed and not _semver_key(chart_version) > _semver_key(old_chart):
        errors.append(f"the chart changed since {prev} but its version {chart_version} is not above {old_chart}: "
                      "bump it")
    return errors


def _semver_key(version: str) -> tuple:
    """Precedence of a SemVer (build metadata ignored; a pre-release sorts before its release)."""
    m = SEMVER.fullmatch(version)
    if not m:
        return (-1,)
    core = tuple(int(x) for x in m.groups())
    pre = version.split("+", 1)[0].partition("-")[2]
    if not pre:
        return (*core, 1)
    return (*core, 0, *[(0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="the tag being released, e.g. v0.2.0")
    parser.add_argument("--notes", metavar="VERSION", help="print VERSION's CHANGELOG.md section and exit")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.notes:
        sys.stdout.write(notes((args.root / "CHANGELOG.md").read_text(), args.notes))
        return 0
    found, errors = check(args.root, args.tag)
    for e in errors:
        print(f"release_check: {e}", file=sys.stderr)
    if errors:
        return 1
    for key, value in found.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
