"""The house stays readable: subsystem packages, one-way imports, rooms of a readable size.

See docs/architecture.md. These checks read the source (ast), they run nothing.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import exporter
from exporter.attribution import schemes
from exporter.attribution.allocations import SCHEMES

ROOT = Path(exporter.__file__).resolve().parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# What each subsystem may import from the others; model.py is the shared vocabulary of all.
# The flow sample -> attribute -> snapshot -> render reads from left to right: node (the sources)
# imports attribution only; pipeline (the cycle) carries a sample through attribution to the
# exposition; the server serves what the pipeline published; top is a client of the server's JSON.
# bundle (the generators) reads the Xid catalog and exposition/label_names.py, the one label-name check
# the exporter's flags and the generators share (test_bundle_reads_only_the_label_names_of_exposition).
MAY_IMPORT = {
    "model": set(),
    "attribution": {"model"},
    "exposition": {"model", "attribution"},
    "node": {"model", "attribution"},
    "pipeline": {"model", "attribution", "exposition"},
    "xid": {"model", "node"},
    "bundle": {"model", "xid", "exposition"},
    "server": {"model", "exposition", "pipeline", "xid"},
    "top": {"exposition"},
    "shell": {"model", "attribution", "exposition", "node", "pipeline", "xid", "bundle", "server", "top"},
}


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _subsystem(path: Path) -> str | None:
    rel = path.relative_to(ROOT).parts
    if len(rel) == 1:
        return rel[0].removesuffix(".py") if rel[0] == "model.py" else None
    return rel[0]


def _imported_subsystems(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "exporter" and len(parts) > 1 and parts[1] in MAY_IMPORT:
                out.add(parts[1])
    return out


def test_every_package_is_a_known_subsystem() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(MAY_IMPORT) - {"model"}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path: Path) -> None:
    own = _subsystem(path)
    if own is None:
        return  # exporter/__init__.py, __main__.py: the package's face and entry point
    wrong = _imported_subsystems(path) - MAY_IMPORT[own] - {own}
    assert not wrong, f"{path.relative_to(ROOT)} ({own}) imports {sorted(wrong)}"


def test_bundle_reads_only_the_label_names_of_exposition() -> None:
    """bundle may import exposition for two modules: the generators must not grow on the exporter's rows.

    label_names.py (the one check of label names) and thresholds.py (the alerts' thresholds the status
    page's problems share)."""
    imported = set()
    for path in (ROOT / "bundle").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("exporter.exposition"):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("exporter.exposition")}
    assert imported <= {"exporter.exposition.label_names", "exporter.exposition.thresholds",
                        "exporter.exposition"}, sorted(imported)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_rooms_stay_readable(path: Path) -> None:
    source = path.read_text()
    assert source.count("\n") <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.relative_to(ROOT)}:{node.name} is {length} lines"


def test_package_faces_hand_nothing_on() -> None:
    """An __init__.py is a docstring: importers name the module that defines a thing."""
    for init in ROOT.rglob("__init__.py"):
        body = ast.parse(init.read_text()).body
        code = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if init.parent == ROOT:
            continue  # exporter/__init__.py holds __version__
        assert not code, f"{init.relative_to(ROOT)} defines or imports something"


def test_every_scheme_module_is_registered() -> None:
    """Adding a sharing scheme is a module plus its line in SCHEMES: forgetting the line fails here."""
    modules = [m.name for m in pkgutil.iter_modules(schemes.__path__) if m.name != "base"]
    defined = [importlib.import_module(f"{schemes.__name__}.{m}").SCHEME for m in modules]
    assert sorted(s.name for s in defined) == sorted(s.name for s in SCHEMES)
    assert len({s.name for s in SCHEMES}) == len(SCHEMES)
