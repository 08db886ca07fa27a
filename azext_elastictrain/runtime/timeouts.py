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

import math
import os
from datetime import timedelta
from typing import Any, Mapping

from azext_elastictrain.core import launch


def collective_timeout(environ: Mapping[str, Any] | None = None) -> timedelta:
    """The job's collective timeout (``ELASTICTRAIN_COLLECTIVE_TIMEOUT_SECONDS``, set by the launch); outside a
    job, the launch's default. Raises ValueError for a value that is not a number of seconds above 0."""
    env = os.environ if environ is None else environ
    found = _seconds(env, launch.ENV_COLLECTIVE_TIMEOUT, "the seconds a collective may wait for a peer",
                     f"default {launch.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS:g}")
    return timedelta(seconds=launch.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS) if found is None else found


def peer_timeout(environ: Mapping[str, Any] | None = None) -> timedelta | None:
    """Restart mode: how long a peer may go unheard before this worker takes it for gone
    (``ELASTICTRAIN_PEER_TIMEOUT_SECONDS``, default core/launch.py's; ``off``: None, never). Raises ValueError for
    a value that is neither ``off`` nor a number of seconds above 0."""
    env = os.environ if environ is None else environ
    if str(env.get(launch.ENV_PEER_TIMEOUT, "")).strip().lower() == "off":
        return None
    found = _seconds(env, launch.ENV_PEER_TIMEOUT, "the seconds a peer may go unheard, or off",
                     f"default {launch.PEER_TIMEOUT_SECONDS:g}")
    return timedelta(seconds=launch.PEER_TIMEOUT_SECONDS) if found is None else found


def replica_timeout(environ: Mapping[str, Any] | None = None) -> timedelta:
    """How long the in-process mode's cross-node collective and commit wait for a peer: torchft's
    ``TORCHFT_TIMEOUT_SEC`` if set, else the backend's (``ELASTICTRAIN_REPLICA_TIMEOUT_SECONDS``, core/launch.py),
    else the job's collective timeout. Raises ValueError for a value that is not a number of seconds above 0."""
    env = os.environ if environ is None else environ
    for name in ("TORCHFT_TIMEOUT_SEC", launch.ENV_REPLICA_TIMEOUT):
        found = _seconds(env, name, "the seconds the cross-node collective may wait for a peer",
                         f"default {launch.LOCAL.replica_timeout_seconds:g} locally")
        if found is not None:
            return found
    return collective_timeout(env)


def _seconds(env: Mapping[str, Any], name: str, what: str, default: str) -> timedelta | None:
    """``env[name]`` as a timeout; None when unset or empty. Raises ValueError unless it is seconds above 0."""
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{name}={raw!r}: give {what}, more than 0 ({default})")
    return timedelta(seconds=seconds)


__all__ = ["collective_timeout", "peer_timeout", "replica_timeout"]
