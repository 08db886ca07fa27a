"""Run azdev's command-table linter rules on this extension, offline.

``azdev linter <ext>`` needs an ``azdev setup`` (a checkout of azure-cli and of
azure-cli-extensions on disk) and reaches the network: it downloads the
per-verb example thresholds (``cmd_example_config.json``) and requests every
un-backticked URL in help text.  This runs the same rule functions, from the
pinned azdev package, on the commands and help of our extension as the real
``az`` loads them (``AZURE_EXTENSION_DEV_SOURCES``):

* every rule of the ``help_file_entries``, ``command_groups``, ``commands`` and
  ``params`` kinds at every severity (azure-cli-extensions CI blocks on HIGH
  only), with our ``linter_exclusions.yml`` (azdev's CI exclusions name only
  azure-cli modules: off, which also spares azdev's module index);
* ``missing_command_example`` (HIGH) on every command, as for a new extension
  (azdev runs it on the commands a pull request changes), with the thresholds
  azdev ships;
* no network.  At import azdev reads ``scripts/ci/cmdcov.yml`` from the azure-cli
  checkout its config names, or else downloads it: it gets one here (a temporary
  "checkout" named by ``AZDEV_CLI_REPO_PATH``) whose patterns match nothing --
  they serve only the test-coverage rules, which are not run.  HTTP requests
  azdev's rules would make are answered "503" on the spot, so the threshold
  file comes from azdev's own copy and any link azdev would request is reported
  as broken (stricter than online: wrap example links in backticks, as azdev's
  message says).

The git-diff based test-coverage rules (``missing_command_test_coverage``,
``missing_parameter_test_coverage``) compare a pull request's branches and are
not run.

Run: ``python -m tests.support.azdev_linter`` (in the az environment); prints
azdev's report and, last, one line of JSON; exit status 0 only with 0 findings.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

EXTENSION = "elastictrain"
REPO_ROOT = Path(__file__).resolve().parents[2]
EXCLUSIONS = REPO_ROOT / "linter_exclusions.yml"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FAIL_LINE = re.compile(r"^-\s+FAIL - (HIGH|MEDIUM|LOW) severity: (\w+)$")
_PASS_LINE = re.compile(r"^-\s+pass: (\w+)", re.M)


class _Offline:
    """Stands in for ``requests`` inside azdev's linter: nothing leaves this machine."""

    class exceptions:  # noqa: N801  (the attribute azdev reads: requests.exceptions.RequestException)
        RequestException = OSError

    class _Unavailable:
        status_code = 503

        @staticmethod
        def json():
            raise ValueError("offline")

    @classmethod
    def get(cls, url, **_kwargs):
        return cls._Unavailable()


def _load_extension_commands():
    """The real az's command table, arguments, parser and help, cut down to this extension's commands."""
    from azure.cli.core import get_default_cli
    from azure.cli.core.commands import ExtensionCommandSource, register_cache_arguments
    from azure.cli.core.commands.arm import register_global_subscription_argument, register_ids_argument
    from azure.cli.core.commands.events import (
        EVENT_INVOKER_POST_LOAD_ARGUMENTS,
        EVENT_INVOKER_PRE_LOAD_ARGUMENTS,
    )
    from azure.cli.core.file_util import get_all_help
    from knack.events import EVENT_INVOKER_POST_CMD_TBL_CREATE, EVENT_INVOKER_PRE_CMD_TBL_CREATE

    # The steps of azure.cli.core.file_util.create_invoker_and_load_cmds_and_args (what azdev calls), with the
    # table cut to our commands before arguments, parser and help are built for every command of az.
    cli = get_default_cli()
    register_global_subscription_argument(cli)
    register_ids_argument(cli)
    register_cache_arguments(cli)
    invoker = cli.invocation_cls(cli_ctx=cli, commands_loader_cls=cli.commands_loader_cls,
                                 parser_cls=cli.parser_cls, help_cls=cli.help_cls)
    cli.invocation = invoker
    loader = invoker.commands_loader
    loader.skip_applicability = True
    cli.raise_event(EVENT_INVOKER_PRE_CMD_TBL_CREATE, args=[])
    loader.load_command_table(None)
    loader.command_name = ""
    ours = {name: cmd for name, cmd in loader.command_table.items()
            if isinstance(cmd.command_source, ExtensionCommandSource) and cmd.command_source.extension_name == EXTENSION}
    if not ours:
        raise SystemExit(f"az loaded no command of the extension {EXTENSION!r}: is AZURE_EXTENSION_DEV_SOURCES set?")
    loader.command_table = ours
    loader.command_group_table = {name: group for name, group in loader.command_group_table.items()
                                  if name == EXTENSION or name.startswith(EXTENSION + " ")}
    cli.raise_event(EVENT_INVOKER_PRE_LOAD_ARGUMENTS, commands_loader=loader)
    loader.load_arguments()
    cli.raise_event(EVENT_INVOKER_POST_LOAD_ARGUMENTS, commands_loader=loader)
    cli.raise_event(EVENT_INVOKER_POST_CMD_TBL_CREATE, commands_loader=loader)
    invoker.parser.cli_ctx = cli
    invoker.parser.load_command_table(loader)
    loaded_help = {h.command: h for h in get_all_help(cli, skip=False) if h.command}
    return loader, loaded_help


def _help_file_entries(loader) -> dict:
    import yaml
    from knack.help_files import helps

    return {name: yaml.safe_load(text) for name, text in helps.items()
            if name == EXTENSION or name.startswith(EXTENSION + " ")}


def _missing_examples(loaded_help: dict, exclusions: dict) -> list[str]:
    """azdev's Linter.check_missing_command_example, on every command (a new extension: all are new)."""
    from azdev.operations.linter.util import get_cmd_example_configurations, get_cmd_example_threshold

    config = get_cmd_example_configurations()  # offline: azdev's packaged copy
    if not config:
        raise SystemExit("azdev's packaged cmd_example_config.json is missing: cannot check examples")
    excluded = {name for name, rules in exclusions.items() if "missing_command_example" in rules.get("rule_exclusions", [])}
    found = []
    for name, cmd_help in sorted(loaded_help.items()):
        if name in excluded or type(cmd_help).__name__ != "CliCommandHelpFile" or not cmd_help.parameters:
            continue
        threshold = get_cmd_example_threshold(name.split()[-1], config)
        if threshold and len(getattr(cmd_help, "examples", []) or []) < threshold:
            found.append(f"Command `{name}` should have at least {threshold} example(s)")
    return found


def findings_in(report: str) -> list[str]:
    """One line per violation: azdev prints a FAIL line per rule, then each violation indented."""
    findings, rule = [], None
    for line in report.splitlines():
        failed = _FAIL_LINE.match(line.rstrip())
        if failed:
            rule = f"{failed.group(1)} {failed.group(2)}"
        elif rule and line.startswith("    ") and line.strip():
            findings.append(f"{rule}: {line.strip()}")
        elif not line.strip() or line.startswith("-"):
            rule = None
    return findings


# The keys azdev.operations.regex reads at import; "(?!)" matches nothing.
_CMDCOV_KEYS = ("CMD_PATTERN", "QUO_PATTERN", "END_PATTERN", "DOCS_END_PATTERN", "NOT_END_PATTERN",
                "NUMBER_SIGN_PATTERN")


def _offline_azdev_config(folder: Path) -> None:
    """azdev's config (AZDEV_* variables) pointing at ``folder``: never at ~/.azdev, never at the network."""
    cmdcov = folder / "cli" / "scripts" / "ci" / "cmdcov.yml"
    cmdcov.parent.mkdir(parents=True)
    cmdcov.write_text("".join(f"{key}: {['(?!)'] * 4 if key == 'CMD_PATTERN' else '(?!)'}\n".replace("'", '"')
                              for key in _CMDCOV_KEYS), encoding="utf-8")
    os.environ["AZDEV_CONFIG_DIR"] = str(folder / "azdev-config")
    os.environ.setdefault("VIRTUAL_ENV", sys.prefix)  # azdev keys its config by the virtualenv it runs in
    os.environ["AZDEV_CLI_REPO_PATH"] = str(folder / "cli")


def run() -> dict:
    import yaml
    from azdev.operations.linter import util as linter_util
    from azdev.operations.linter.linter import LinterManager, LinterSeverity

    linter_util.requests = _Offline  # the only module of azdev's linter that makes requests
    exclusions = {}
    if EXCLUSIONS.is_file():
        exclusions = yaml.safe_load(EXCLUSIONS.read_text(encoding="utf-8")) or {}
    loader, loaded_help = _load_extension_commands()
    manager = LinterManager(command_loader=loader, help_file_entries=_help_file_entries(loader),
                            loaded_help=loaded_help, exclusions=exclusions, use_ci_exclusions=False,
                            min_severity=LinterSeverity.LOW)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        manager.run(run_params=True, run_commands=True, run_command_groups=True, run_help_files_entries=True,
                    run_command_test_coverage=False)
    report = _ANSI.sub("", out.getvalue())
    findings = findings_in(report)
    missing = _missing_examples(loaded_help, exclusions)
    findings += [f"HIGH missing_command_example: {m}" for m in missing]
    report += ("".join(f"- FAIL - HIGH severity: missing_command_example\n    {m}\n" for m in missing)
               or "- pass: missing_command_example\n")
    return {
        "commands": len(loader.command_table),
        "command_groups": len(loader.command_group_table),
        "help_entries": len(_help_file_entries(loader)),
        "rules_passed": sorted(set(_PASS_LINE.findall(report))),
        "findings": findings,
        "report": report,
    }


def main() -> int:
    os.environ.setdefault("AZURE_CORE_COLLECT_TELEMETRY", "false")
    with tempfile.TemporaryDirectory(prefix="azdev-offline-") as folder:
        _offline_azdev_config(Path(folder))
        result = run()
    print(result["report"])
    print(json.dumps({k: v for k, v in result.items() if k != "report"}))
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
