"""Package hygiene the import contracts cannot see: no private name crosses a package.

Which package may import which is written as import-linter contracts in pyproject.toml
(``lint-imports``, run by ``make lint``). A name that starts with ``_`` belongs to the
package that defines it (a subpackage of ``mmdtl2_dist``, or one of its top-level
modules): another package that needs it gets a public name instead. These tests parse
every module of the package with :mod:`ast` and list each ``from mmdtl2_dist.X… import
_name`` and each ``module._name`` (``module`` bound by an import to a module of another
package), and each import of a private module of MLflow, whose private API changes
between the minor versions the dependency range admits.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mmdtl2_dist"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """``mmdtl2_dist.engine.driver`` -> ``engine``; ``mmdtl2_dist`` -> ``""`` (the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to modules of ``mmdtl2_dist`` by imports, anywhere in the file."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "mmdtl2_dist":
                    aliases[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else "mmdtl2_dist"
                    )
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if node.module.split(".")[0] == "mmdtl2_dist" and is_module(full):
                    aliases[a.asname or a.name] = full
    return aliases


def private_crossings(source: str, module: str) -> list[str]:
    """Private names of other packages of ``mmdtl2_dist`` that ``source`` uses."""
    here = package_of(module)
    tree = ast.parse(source)
    aliases = module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "mmdtl2_dist":
                continue
            for a in node.names:
                there = package_of(f"{node.module}.{a.name}")
                if is_private(a.name) and there != here:
                    found.append((node, f"from {node.module} import {a.name}"))
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            base = dotted(node.value)
            head, _, rest = (base or "").partition(".")
            if head not in aliases:
                continue
            target = f"{aliases[head]}.{rest}" if rest else aliases[head]
            if is_module(target) and package_of(target) != here:
                found.append((node, f"{target}.{node.attr}"))
    found.sort(key=lambda f: (f[0].lineno, f[0].col_offset))
    return [f"line {node.lineno}: {text}" for node, text in found]


def private_mlflow_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mlflow" and any(is_private(p) for p in parts[1:]):
                found.append(f"line {node.lineno}: {name}")
    return found


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_the_checks_see_both_forms_of_a_crossing():
    source = (
        "from mmdtl2_dist.engine.driver import _run_tasks, compute_gram\n"
        "from mmdtl2_dist.study import tracking\n"
        "import mmdtl2_dist.engine.plan as plan\n"
        "import mmdtl2_dist.store.layout\n"
        "from mmdtl2_dist import __version__\n"
        "from mlflow.tracking._model_registry import utils\n"
        "tracking._finite(1); plan._x; mmdtl2_dist.store.layout._y; tracking.metric_key\n"
    )
    assert private_crossings(source, "mmdtl2_dist.deploy.training") == [
        "line 1: from mmdtl2_dist.engine.driver import _run_tasks",
        "line 7: mmdtl2_dist.study.tracking._finite",
        "line 7: mmdtl2_dist.engine.plan._x",
        "line 7: mmdtl2_dist.store.layout._y",
    ]
    assert private_crossings(source, "mmdtl2_dist.engine.other") == [
        "line 7: mmdtl2_dist.study.tracking._finite",
        "line 7: mmdtl2_dist.store.layout._y",
    ]  # inside its own package a private name is fine
    assert private_mlflow_imports(source) == ["line 6: mlflow.tracking._model_registry.utils"]


def test_no_private_name_crosses_a_package():
    found = {}
    for path in modules():
        crossings = private_crossings(path.read_text(), module_name(path))
        if crossings:
            found[str(path.relative_to(ROOT))] = crossings
    assert not found, (
        f"private names used across packages: {found}; give each a public name in the "
        "module that defines it (and export it from its package's __init__)"
    )


def test_no_private_module_of_mlflow_is_imported():
    found = {}
    for path in modules():
        imports = private_mlflow_imports(path.read_text())
        if imports:
            found[str(path.relative_to(ROOT))] = imports
    assert not found, f"private MLflow modules imported: {found}; use MLflow's public API"
