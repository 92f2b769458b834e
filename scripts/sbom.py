#!/usr/bin/env python3
"""A CycloneDX 1.5 SBOM (JSON) of what the image's virtualenv holds: the package and requirements.lock.

    python scripts/sbom.py [-o kube-gpu-exporter.cdx.json] [--lock requirements.lock]

Offline and deterministic: the components are the lock's pins, each with its purl and the sha256 of
every locked wheel (the x86_64 and aarch64 files of a binary package), the metadata component is
kube-gpu-exporter at the version of exporter/_version.py, and the root's dependencies are the
runtime dependencies pyproject.toml names. The serial number is derived from the inputs, and the
timestamp is SOURCE_DATE_EPOCH when set (the release workflow sets it to the tagged commit's time),
so the same inputs give the same bytes. The image's operating system packages are not in it: the
release workflow has BuildKit attach an SBOM of the whole image to the image itself.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import sys
import tomllib
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([a-z0-9]+(?:-[a-z0-9]+)*)==(\S+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def package_version() -> str:
    """exporter/_version.py's literal, read without importing the package."""
    tree = ast.parse((ROOT / "exporter" / "_version.py").read_text())
    (value,) = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
                and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__version__"]]
    return value


def read_lock(path: Path) -> list[tuple[str, str, list[str]]]:
    """(name, version, sha256s) per pin, in file order."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        m = PIN.match(line.strip())
        if m:
            out.append((m.group(1), m.group(2), HASH.findall(line)))
    return out


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{canonical(name)}@{version}"


def sbom(lock: Path) -> dict:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    version = package_version()
    pins = read_lock(lock)
    root_ref = purl(project["name"], version)
    components = [{
        "type": "library", "bom-ref": purl(n, v), "name": n, "version": v, "purl": purl(n, v), "scope": "required",
        "hashes": [{"alg": "SHA-256", "content": h} for h in hashes],
    } for n, v, hashes in pins]
    locked = {n: v for n, v, _ in pins}
    direct = sorted({canonical(re.split(r"[\s<>=!~;\[(]", d, maxsplit=1)[0]) for d in project["dependencies"]})
    missing = [d for d in direct if d not in locked]
    if missing:
        raise SystemExit(f"sbom: {lock.name} lacks runtime dependencies {missing}: run scripts/lock.py")
    digest = hashlib.sha256(lock.read_bytes() + version.encode()).hexdigest()
    metadata: dict = {
        "tools": {"components": [{"type": "application", "name": "kube-gpu-exporter scripts/sbom.py"}]},
        "component": {
            "type": "application", "bom-ref": root_ref, "name": project["name"], "version": version,
            "purl": root_ref, "description": project["description"],
            "licenses": [{"expression": project["license"]}],
        },
    }
    if os.environ.get("SOURCE_DATE_EPOCH"):
        stamp = datetime.fromtimestamp(int(os.environ["SOURCE_DATE_EPOCH"]), UTC)
        metadata = {"timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), **metadata}
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.UUID(digest[:32], version=5)}",
        "version": 1,
        "metadata": metadata,
        "components": components,
        "dependencies": [{"ref": root_ref, "dependsOn": [purl(d, locked[d]) for d in direct]}],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    parser.add_argument("--lock", default=str(ROOT / "requirements.lock"), help="the lock file to describe")
    args = parser.parse_args(argv)
    text = json.dumps(sbom(Path(args.lock)), indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
