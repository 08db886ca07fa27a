"""Suite-wide fixtures: real Azurite, real etcd, the real az.

Services listen on free loopback ports and are always stopped (see
``harness/services.py``).  Tests are marked by folder: tests/unit ->
``unit``, tests/integration -> ``integration``, tests/contract -> ``contract``, tests/e2e -> ``e2e``, so
``-m unit`` selects the fast ones.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(REPO_ROOT) not in sys.path:  # pytest.ini's pythonpath does this too
    sys.path.insert(0, str(REPO_ROOT))

from harness import services as svc  # noqa: E402

_FOLDER_MARKS = ("unit", "integration", "contract", "e2e")
# Modules that train for real with several torchrun agents and assert how fast a job recovers (or depend on when
# a re-form happens): marked ``torchrun``, so scripts/test.sh runs them alone after the rest (which runs in
# parallel). Other multi-process tests (local jobs, memory rescue, resharding, the README's blocks through
# evictions, evict simulate's errors and one eviction's record, exactly-once data through a loss without notice)
# assert no timing: they run in parallel, where their jobs' waiting overlaps the other workers' computing.
_TORCHRUN_MODULES = frozenset({
    "e2e/test_battery.py", "e2e/test_demo.py", "e2e/test_local_chaos.py", "integration/test_elastic_recovery.py",
})
# A module may also mark single tests ``torchrun`` (integration/test_inprocess_recovery.py: the cases whose
# timing three parallel workers on two cores would skew; its others run in parallel).
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-file", metavar="PATH", default=None,
                     help="write every test's seconds (setup + call + teardown), slowest first, and each module's "
                          "total to PATH (scripts/test.sh: build/test-durations/)")


class _DurationsFile:
    """``--durations-file``: on the controller (with xdist, the workers' reports come to it), once at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        wall = time.monotonic() - self.started
        by_module: dict[str, float] = {}
        for nodeid, seconds in self.seconds.items():
            module = nodeid.split("::", 1)[0]
            by_module[module] = by_module.get(module, 0.0) + seconds
        lines = [f"# {len(self.seconds)} tests, {sum(self.seconds.values()):.1f} s of test time (setup + call + "
                 f"teardown, summed over workers), {wall:.1f} s wall; slowest first",
                 *(f"{s:8.2f}  {n}{'  FAILED' if n in self.failed else ''}"
                   for n, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])),
                 "# by module", *(f"{s:8.2f}  {m}" for m, s in sorted(by_module.items(), key=lambda kv: -kv[1]))]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--durations-file")
    if path and not hasattr(config, "workerinput"):  # an xdist worker sends its reports to the controller
        config.pluginmanager.register(_DurationsFile(Path(path)), "elastictrain-durations-file")
    # Clients in the tests (azure-core, requests in az) honour proxy variables;
    # traffic to the local services must never go through a proxy.
    for var in ("no_proxy", "NO_PROXY"):
        current = [h for h in os.environ.get(var, "").split(",") if h]
        os.environ[var] = ",".join(current + [h for h in _LOOPBACK_HOSTS if h not in current])


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        if len(rel.parts) > 1 and rel.parts[0] in _FOLDER_MARKS:
            item.add_marker(getattr(pytest.mark, rel.parts[0]))
        if rel.as_posix() in _TORCHRUN_MODULES:
            item.add_marker(pytest.mark.torchrun)


@pytest.fixture(scope="session", autouse=True)
def memory_tier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime's in-memory copies (ELASTICTRAIN_MEMORY_DIR) go to the session's temp dir, inherited by every
    process a test starts, never to the machine's /dev/shm where they would outlive the test."""
    path = tmp_path_factory.mktemp("memory-tier")
    os.environ["ELASTICTRAIN_MEMORY_DIR"] = str(path)
    return path


def _enter_or_fail(stack: contextlib.ExitStack, cm):
    try:
        return stack.enter_context(cm)
    except svc.ServiceError as exc:
        stack.close()
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[svc.AzuriteService]:
    """Azurite's blob service (on-disk data) for the whole session."""
    with contextlib.ExitStack() as stack:
        yield _enter_or_fail(stack, svc.start_azurite(tmp_path_factory.mktemp("azurite")))


@pytest.fixture
def container_url(azurite: svc.AzuriteService) -> Iterator[str]:
    """A fresh, empty container in the session's Azurite: ``{blob_endpoint}/{name}``."""
    name = f"t-{uuid.uuid4().hex[:20]}"
    client = azurite.blob_service_client()
    try:
        client.create_container(name)
        yield f"{azurite.blob_endpoint}/{name}"
    finally:
        try:
            client.delete_container(name)
        except Exception:  # noqa: BLE001  the test may have deleted it
            pass
        client.close()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[svc.EtcdService]:
    """A one-member etcd with the v2 API for the whole session."""
    with contextlib.ExitStack() as stack:
        yield _enter_or_fail(stack, svc.start_etcd(tmp_path_factory.mktemp("etcd")))


@pytest.fixture
def az(tmp_path: Path) -> svc.AzCli:
    """The real az (.venv/bin/az) with an isolated AZURE_CONFIG_DIR and this
    checkout as a dev extension: ``az("elastictrain", "--help")`` returns a
    CompletedProcess (text); ``check=True`` raises on a non-zero exit;
    ``az.json(...)`` adds ``-o json`` and parses stdout."""
    try:
        svc.check_dev_extension()
        return svc.AzCli(tmp_path / "azure-config")
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def az_json(az: svc.AzCli):
    """``az_json(*args)``: run ``az ... -o json`` and return the parsed stdout."""
    return az.json
