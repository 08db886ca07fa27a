"""The gates azure-cli-extensions CI runs on an extension, at 0 findings.

* ``azdev linter``: its rules on our command table and help as the real az loads them
  (``tests/support/azdev_linter.py`` runs them offline, at every severity);
* ``azdev style``: flake8 with azdev's extension config (``ext.flake8``) over the sources, tests, harness/ and setup.py,
  and pylint with azdev's ``ext_pylintrc`` plus azdev's own checker (``show_command``) over the package.

The tools are the pinned ones scripts/setup.sh installs (azdev, pylint, flake8); their configs are read from the
installed azdev package, never copied.  A rule that must be excepted goes into ``linter_exclusions.yml`` (azdev's
format) with the reason; style findings are fixed, not silenced.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import services as svc
from tests.support.azdev_linter import findings_in

REPO_ROOT = Path(__file__).resolve().parents[2]
GATE_TIMEOUT_S = 300

# Every rule of azdev 0.2.13 that runs without a pull request's git diff, by name: a run that skipped one
# (or a report this test could not read) fails here instead of passing with "0 findings".
AZDEV_RULES = {
    # help entries
    "faulty_help_example_parameters_rule", "faulty_help_example_rule", "faulty_help_type_rule",
    "unrecognized_help_entry_rule", "unrecognized_help_parameter_rule",
    # command groups
    "broken_site_link_from_command_group", "disallowed_html_tag_from_command_group", "expired_command_group",
    "missing_group_help", "require_wait_command_if_no_wait",
    # commands
    "broken_site_link_from_command", "disallowed_html_tag_from_command", "expired_command",
    "group_delete_commands_should_confirm", "missing_command_help", "no_ids_for_list_commands",
    "missing_command_example",
    # parameters
    "bad_short_option", "broken_site_link_from_parameter", "disallowed_html_tag_from_parameter", "expired_option",
    "expired_parameter", "id_params_only_for_guid", "missing_parameter_help",
    "no_parameter_defaults_for_update_commands", "no_positional_parameters", "no_required_location_param",
    "option_length_too_long", "option_should_not_contain_under_score", "parameter_should_not_end_in_resource_group",
}


def _azdev_dir() -> Path:
    spec = importlib.util.find_spec("azdev")  # located, not imported: importing azdev's linter reaches the network
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("azdev is not installed in this Python (run `bash scripts/setup.sh`)", pytrace=False)
    return Path(list(spec.submodule_search_locations)[0])


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=GATE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)


def test_azdev_linter_rules_find_nothing(tmp_path):
    svc.check_dev_extension()
    result = _run([sys.executable, "-m", "tests.support.azdev_linter"], env=svc.az_env(tmp_path / "azure-config"))
    lines = result.stdout.strip().splitlines()
    assert lines, f"the linter printed nothing (exit {result.returncode}):\n{result.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    assert summary["findings"] == [], "\n".join(summary["findings"])
    assert result.returncode == 0, result.stderr[-3000:]
    # what was linted: every command and group of the extension, every help entry, every rule
    assert summary["commands"] >= 18 and summary["command_groups"] >= 5 and summary["help_entries"] >= 23, summary
    assert set(summary["rules_passed"]) == AZDEV_RULES


def test_flake8_with_azdevs_extension_config_finds_nothing():
    config = _azdev_dir() / "config" / "ext.flake8"
    # azdev style runs flake8 over the extension's folder: its package, tests, the harness they share with the
    # benchmarks and setup.py (ext.flake8 leaves out scripts/); here that folder is the repository root, which also
    # holds .venv/ and build/.
    result = _run([sys.executable, "-m", "flake8", "--statistics", f"--append-config={config}",
                   "azext_elastictrain", "tests", "harness", "setup.py"])
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.slow  # 65 s here (2 shared cores): pylint infers through torch and the Azure SDKs
def test_pylint_with_azdevs_ext_pylintrc_finds_nothing():
    azdev = _azdev_dir()
    checkers = azdev / "operations" / "linter" / "pylint_checkers"
    plugins = sorted(p.stem for p in checkers.glob("*.py") if p.name != "__init__.py")
    assert plugins, f"azdev's pylint checkers are missing from {checkers}"
    env = dict(os.environ, PYTHONPATH=str(checkers))
    result = _run([sys.executable, "-m", "pylint", f"--rcfile={azdev / 'config' / 'ext_pylintrc'}",
                   f"--load-plugins={','.join(plugins)}", "--jobs=2", "--score=n", "azext_elastictrain"], env=env)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# An excerpt of azdev's report (ANSI colours already stripped), as it printed our help before the fix.
_REPORT = """\
-  pass: broken_site_link_from_command
-  FAIL - HIGH severity: disallowed_html_tag_from_command
    Command: `elastictrain checkpoint download` - Disallowed html tags ['<dest>'] in long summary.

-  pass: expired_command
-  FAIL - MEDIUM severity: broken_site_link_from_parameter
    Parameter: elastictrain checkpoint list, `url` - Broken links ['https://<account>.blob.core.windows.net'] in ...
    Parameter: elastictrain checkpoint show, `url` - Broken links ['https://<account>.blob.core.windows.net'] in ...

-  pass: expired_option
"""


def test_the_linter_report_is_read_one_finding_per_violation():
    assert findings_in(_REPORT) == [
        "HIGH disallowed_html_tag_from_command: Command: `elastictrain checkpoint download` - Disallowed html tags "
        "['<dest>'] in long summary.",
        "MEDIUM broken_site_link_from_parameter: Parameter: elastictrain checkpoint list, `url` - Broken links "
        "['https://<account>.blob.core.windows.net'] in ...",
        "MEDIUM broken_site_link_from_parameter: Parameter: elastictrain checkpoint show, `url` - Broken links "
        "['https://<account>.blob.core.windows.net'] in ...",
    ]


def test_the_extension_metadata_admits_the_az_the_tests_run_and_no_older():
    from azure.cli.core import __version__ as core_version
    from azure.cli.core.extension import ext_compat_with_cli

    metadata = json.loads((REPO_ROOT / "azext_elastictrain" / "azext_metadata.json").read_text(encoding="utf-8"))
    pinned = re.search(r"\bazure-cli==([0-9.]+)", (REPO_ROOT / "scripts" / "setup.sh").read_text()).group(1)
    assert core_version == pinned, "the tests run another az than scripts/setup.sh pins"
    assert metadata["azext.minCliCoreVersion"] == pinned
    assert "azext.maxCliCoreVersion" not in metadata  # a maximum would refuse every later az, patches included
    assert metadata["azext.isPreview"] is True and metadata["azext.isExperimental"] is False
    assert ext_compat_with_cli(metadata)[0], "az refuses the extension with its own metadata"
    older = dict(metadata, **{"azext.minCliCoreVersion": "99.0.0"})
    assert not ext_compat_with_cli(older)[0]  # the check that protects older az is az's own, and it bites
