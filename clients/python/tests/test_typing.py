"""The package is typed (mypy --strict passes, py.typed ships) and keeps Python 3.9 syntax."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import redb_limiter

PACKAGE = Path(__file__).resolve().parents[1]
SOURCES = sorted((PACKAGE / "src" / "redb_limiter").glob("*.py"))


def test_mypy_strict_passes_over_the_package() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "src/redb_limiter"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_installed_package_ships_py_typed() -> None:
    installed = Path(redb_limiter.__file__).parent
    assert (installed / "py.typed").exists(), installed


def test_every_module_parses_as_python_3_9() -> None:
    assert SOURCES
    for source in SOURCES:
        text = source.read_text()
        ast.parse(text, filename=str(source), feature_version=(3, 9))
        assert text.startswith('"""'), f"{source.name} opens with a docstring saying what it owns"
        if "annotations" not in text and source.name != "__init__.py":
            raise AssertionError(f"{source.name} lacks `from __future__ import annotations`")
