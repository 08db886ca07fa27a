"""How long a collective may wait for a peer: the one value every process group of the job is created with.

A Spot VM evicted without notice vanishes: its sockets stay open and no FIN arrives, so a peer blocked in a
collective learns only when the collective times out (torch's default: 30 minutes). torch has no public way to
give the default group a timeout other than ``init_process_group(timeout=...)``, so the script passes this::

    dist.init_process_group("gloo", timeout=collective_timeout())

and the runtime creates its own groups with it. The job's launch sets the value (core/launch.py); a timed-out
collective raises, the worker fails, and torchrun re-forms the world without the vanished node. In the restart
mode the runtime does not wait for it: a peer unheard for the peer timeout ends the worker sooner
(runtime/peer_watch.py), whatever the script passed.
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Mapping

from azext_elastictrain.core.settings import RuntimeSettings


def _settings(environ: Mapping[str, Any] | None) -> RuntimeSettings:
    return RuntimeSettings.from_env(os.environ if environ is None else environ)


def collective_timeout(environ: Mapping[str, Any] | None = None) -> timedelta:
    """The job's collective timeout (``ELASTICTRAIN_COLLECTIVE_TIMEOUT_SECONDS``, set by the launch); outside a
    job, the local figure (core/settings.py). Raises ValueError for a value that is not seconds above 0."""
    return timedelta(seconds=_settings(environ).collective_timeout_seconds)


def peer_timeout(environ: Mapping[str, Any] | None = None) -> timedelta | None:
    """Restart mode: how long a peer may go unheard before this worker takes it for gone
    (``ELASTICTRAIN_PEER_TIMEOUT_SECONDS``; ``off``: None, never). Raises ValueError for a value that is neither
    ``off`` nor a number of seconds above 0."""
    seconds = _settings(environ).peer_timeout_seconds
    return None if seconds is None else timedelta(seconds=seconds)


def replica_timeout(environ: Mapping[str, Any] | None = None) -> timedelta:
    """How long the in-process mode's cross-node collective and commit wait for a peer: torchft's
    ``TORCHFT_TIMEOUT_SEC`` if set, else the backend's (``ELASTICTRAIN_REPLICA_TIMEOUT_SECONDS``), else the job's
    collective timeout. Raises ValueError for a value that is not a number of seconds above 0."""
    return timedelta(seconds=_settings(environ).replica_timeout)


__all__ = ["collective_timeout", "peer_timeout", "replica_timeout"]
