"""Fixtures the end-to-end modules share: the real az comes from tests/conftest.py; here a local cluster for a
module's tests to share (starting one takes seconds, and the tests of a module do not disturb each other)."""
from __future__ import annotations

from typing import Iterator

import pytest

from harness import services as svc
from tests.support.processes import local_cluster


@pytest.fixture(scope="module")
def local_az(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[svc.AzCli]:
    """The real az with an isolated config dir and a healthy local cluster in it, for the module; afterwards the
    cluster is deleted and anything still running for that config dir is killed (tests/support/processes.py)."""
    folder = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    try:
        with local_cluster(folder / "azure-config") as az:
            yield az
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
