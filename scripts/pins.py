"""setup.py's pinned requirements, for the places that install before (or without) it: scripts/setup.sh.

    python3 scripts/pins.py torch            # -> torch==<the version setup.py pins>

setup.py owns every Python pin (install_requires, extras_require); this reads them from its DEPENDENCIES and
EXTRAS literals without running it (its setup() call would build). scripts/Dockerfile cannot read them before
its torch layer (that would rebuild the layer on any change to setup.py): tests/unit/test_version_pins.py holds
its pins, and any other `name==version` of these packages in the tree, equal to setup.py's.
Runs on the system's python3 (no third-party imports).
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


def requirements(setup_py: Path = SETUP_PY) -> list[str]:
    """Every requirement setup.py names: DEPENDENCIES, then each extra of EXTRAS."""
    found: dict[str, Any] = {}
    for node in ast.parse(setup_py.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name) and target.id in ("DEPENDENCIES", "EXTRAS") and node.value is not None:
                found[target.id] = ast.literal_eval(node.value)
    extras = found.get("EXTRAS", {})
    assert isinstance(extras, dict), "setup.py's EXTRAS is not a dict literal"
    return [*found.get("DEPENDENCIES", []), *(r for reqs in extras.values() for r in reqs)]


def pin(name: str, setup_py: Path = SETUP_PY) -> str:
    """``name==version`` as setup.py pins ``name``; ValueError when it does not pin it (or pins it twice apart)."""
    pins = {r for r in requirements(setup_py) if re.fullmatch(rf"{re.escape(name)}==[\w.+!-]+", r)}
    if len(pins) != 1:
        raise ValueError(f"setup.py pins {name} {'nowhere' if not pins else 'as ' + ', '.join(sorted(pins))}")
    return pins.pop()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python3 scripts/pins.py NAME [NAME ...]")
    try:
        print(" ".join(pin(name) for name in sys.argv[1:]))
    except ValueError as error:
        sys.exit(f"scripts/pins.py: {error}")
