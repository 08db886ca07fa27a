"""Each version pin has one owner, and the places that cannot read it are held equal to it here.

* Python packages: setup.py (``DEPENDENCIES``, ``EXTRAS``). scripts/setup.sh reads torch's pin from it
  (scripts/pins.py); scripts/Dockerfile types torch's and torchft's in its first layer (reading setup.py there
  would rebuild the layer, most of the image, on any change to setup.py); the README names torch's and
  backends/local/starting.py torchft's in a hint. Every ``name==version`` of a package setup.py pins, anywhere in
  the tree, must be setup.py's.
* The training image's user: core.aks.manifests.IMAGE_USER (the coordinator pod's runAsUser). scripts/Dockerfile
  creates that user and runs as it.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from azext_elastictrain.core.aks.manifests import IMAGE_USER

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "scripts" / "Dockerfile"
SETUP_SH = REPO / "scripts" / "setup.sh"
# Where a pin of another version is not a second owner: the history, and this file's made-up examples.
NOT_OWNERS = {"HISTORY.rst", "tests/unit/test_version_pins.py"}
SKIPPED_DIRS = {".git", ".venv", ".tools", "build", "dist", "node_modules", "__pycache__", ".mypy_cache",
                ".hypothesis", "out"}
TEXT_SUFFIXES = {".py", ".sh", ".md", ".rst", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml", ".json"}


def setup_py_pins(setup_py: Path = REPO / "setup.py") -> dict[str, str]:
    """{name: version} of every ``name==version`` setup.py's DEPENDENCIES and EXTRAS name (read, not run)."""
    values = {}
    for node in ast.parse(setup_py.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) and target.id in ("DEPENDENCIES", "EXTRAS"):
                    values[target.id] = ast.literal_eval(node.value)
    requirements = [*values["DEPENDENCIES"], *(r for reqs in values["EXTRAS"].values() for r in reqs)]
    pins: dict[str, str] = {}
    for requirement in requirements:
        if "==" in requirement:
            name, version = requirement.split("==")
            assert pins.setdefault(name, version) == version, f"setup.py pins {name} twice apart"
    return pins


def pins_in(text: str, names) -> list[tuple[str, str]]:
    """(name, version) of each ``name==version`` of those packages in ``text``."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.findall(rf"(?<![\w.-])({alternatives})==([\w.+!-]*\w)", text)


def dockerfile_uids(text: str) -> tuple[list[str], list[str]]:
    """The uids ``useradd --uid`` creates and those ``USER`` instructions run as."""
    created = re.findall(r"\buseradd\b[^\n]*?--uid[ =](\S+)", text)
    users = re.findall(r"^USER\s+(\S+)\s*$", text, flags=re.MULTILINE)
    return created, users


def test_setup_py_pins_torch_and_torchft():
    pins = setup_py_pins()
    assert {"torch", "torchft"} <= pins.keys(), pins


def test_the_dockerfile_installs_setup_pys_torch_and_torchft():
    pins = setup_py_pins()
    installs = [line for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
                if re.match(r"RUN\s+pip\s+install\b", line)]
    typed = dict(pins_in("\n".join(installs), ["torch", "torchft"]))
    assert typed == {"torch": pins["torch"], "torchft": pins["torchft"]}, (
        f"scripts/Dockerfile's pip install pins {typed}; setup.py pins torch=={pins['torch']}, "
        f"torchft=={pins['torchft']}: change the Dockerfile's line to setup.py's")


def test_the_dockerfile_runs_as_image_user():
    created, users = dockerfile_uids(DOCKERFILE.read_text(encoding="utf-8"))
    assert created and users, "scripts/Dockerfile: no `useradd --uid` or no `USER` line"
    assert set(created) == set(users) == {str(IMAGE_USER)}, (
        f"scripts/Dockerfile creates uid {created} and runs as {users}; core.aks.manifests.IMAGE_USER (the pods' "
        f"runAsUser) is {IMAGE_USER}")


def test_setup_sh_installs_torch_at_setup_pys_pin():
    """setup.sh pip-installs torch's CPU wheel first (before setup.py's [train] extra) at the pin scripts/pins.py
    reads from setup.py: run here with this interpreter as setup.sh runs it with python3."""
    script = SETUP_SH.read_text(encoding="utf-8")
    assert re.search(r'^TORCH_REQUIREMENT="\$\(python3 scripts/pins\.py torch\)"', script, re.MULTILINE), script
    assert re.search(r'^PIP_FIRST=\("\$TORCH_REQUIREMENT" ', script, re.MULTILINE)
    assert re.search(r'^PIP_REQUIREMENTS=\([^)]*"\$TORCH_REQUIREMENT"', script, re.MULTILINE)
    printed = subprocess.run([sys.executable, "scripts/pins.py", "torch"], cwd=REPO, capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    assert printed == f"torch=={setup_py_pins()['torch']}"


def _text_files():
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in TEXT_SUFFIXES or name.startswith("Dockerfile"):
                yield path


def test_no_other_version_of_a_setup_py_pin_is_named_anywhere():
    """A ``name==version`` of a package setup.py pins, in any file but setup.py (and the history), is setup.py's:
    the Dockerfile, the README, a hint in an error message, a comment."""
    pins = setup_py_pins()
    drift = []
    for path in _text_files():
        relative = path.relative_to(REPO).as_posix()
        if relative in NOT_OWNERS or relative == "setup.py":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        drift += [f"{relative}: {name}=={version} (setup.py: {pins[name]})"
                  for name, version in pins_in(text, pins) if version != pins[name]]
    assert drift == [], "\n".join(drift)


@pytest.mark.parametrize("text, expected", [
    ("RUN pip install torch==2.0.1 torchft==0.1.0", [("torch", "2.0.1"), ("torchft", "0.1.0")]),
    ("`torch==2.0.1`, (pip install torchft==0.1.0); its", [("torch", "2.0.1"), ("torchft", "0.1.0")]),
    ("pytorch==1.0 my-torch==1.0 torch==1.0.", [("torch", "1.0")]),
])
def test_pins_in_finds_each_pin_of_those_names(text, expected):
    assert pins_in(text, ["torch", "torchft"]) == expected


def test_dockerfile_uids_reads_useradd_and_user():
    text = "RUN useradd --create-home --uid 4242 trainer\nUSER 4242\nRUN true\nUSER 10001\n"
    assert dockerfile_uids(text) == (["4242"], ["4242", "10001"])
