"""Loading the extension's commands must stay cheap.

az imports every extension's loader on a command index miss and for each
``--help``; the extension must not pull in SDKs (azure.mgmt, azure.storage,
kubernetes, torch, matplotlib) until a command actually runs.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO_ROOT / "azext_elastictrain"
HEAVY_PREFIXES = ("azure.mgmt", "azure.storage", "kubernetes", "torch", "matplotlib")
CLI_PREFIXES = ("knack", "azure.cli")

_PROBE = r"""
import json, sys
heavy = tuple(sys.argv[1].split(","))

def offenders():
    return sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in heavy))

import types
import azext_elastictrain
from azure.cli.core import get_default_cli

baseline = offenders()  # whatever az itself imported, before our loader ran
cli = get_default_cli()
loader = azext_elastictrain.COMMAND_LOADER_CLS(cli_ctx=cli)
table = loader.load_command_table(None)
for name in sorted(table):
    # what az does for `az <command> --help`: the command's own arguments
    # (introspects the operation's signature), then the loader's, which only
    # apply while the invocation's command string is in their scope
    cli.invocation = types.SimpleNamespace(data={"command_string": name})
    table[name].load_arguments()
    loader.command_name = name
    loader.load_arguments(name)
print(json.dumps({"commands": sorted(table), "baseline": baseline, "offenders": offenders()}))
"""


def _run_probe(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env["AZURE_CONFIG_DIR"] = str(tmp_path / "azure-config")
    env["AZURE_CORE_COLLECT_TELEMETRY"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(HEAVY_PREFIXES)],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(f"the probe subprocess failed:\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}", pytrace=False)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_loading_commands_and_arguments_imports_no_sdk(tmp_path: Path) -> None:
    result = _run_probe(tmp_path)
    assert result["commands"], "the extension's command table is empty"
    assert any(c.startswith("elastictrain ") for c in result["commands"]), result["commands"]
    offenders = result["offenders"]
    print("commands:", ", ".join(result["commands"]))
    print("heavy modules imported:", ", ".join(offenders) or "none")
    assert not offenders, (
        f"loading the command table/arguments imported {len(offenders)} heavy module(s): "
        f"{', '.join(offenders[:40])}{' ...' if len(offenders) > 40 else ''}"
        + (f"\n(az itself had already imported: {', '.join(result['baseline'])})" if result["baseline"] else "")
    )


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call):
            # importlib.import_module("x") / __import__("x")
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def test_core_never_imports_the_cli() -> None:
    core = PACKAGE_DIR / "core"
    files = sorted(core.rglob("*.py"))
    assert files, f"no Python files under {core.relative_to(REPO_ROOT)}"
    bad = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for lineno, module in _imported_modules(tree):
            if any(module == p or module.startswith(p + ".") for p in CLI_PREFIXES):
                bad.append(f"{path.relative_to(REPO_ROOT)}:{lineno}: {module}")
    assert not bad, "azext_elastictrain/core must not import knack or azure.cli:\n" + "\n".join(bad)
