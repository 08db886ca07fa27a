"""A job's runtime settings, each written once: its environment variable, its default and how it reads.

``RuntimeSettings`` is one frozen value. Both backends write it into every node's environment with ``to_env()``
(through core/spec.py's ``job_env``: a local node's agent and an AKS worker pod get the same), and the training
runtime reads it back with ``from_env()``, its one reader. ``from_env(to_env(x)) == x`` (tests/unit/test_settings.py).

One precedence rule, everywhere: an argument the script passes (``Checkpointer.from_env(keep=5)``) wins over the
environment, which wins over the default here. One exception, kept for torchft's users: torchft's own
``TORCHFT_TIMEOUT_SEC`` wins over ours for the replica timeout (the torchft Manager reads it too).

A new runtime option is its argument and help (_params.py, _help.py), a field of the job spec (core/spec.py), a
field here and its line in ``JobSpec.runtime_settings``: nothing else names it on the way to the runtime.

Pure and stdlib only (the runtime imports it; so does ``az``, which must not import torch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Mapping, TypeVar

from azext_elastictrain.core import launch

T = TypeVar("T")
OFF = "off"
_SWITCH = {"on": True, "1": True, "true": True, "yes": True, OFF: False, "0": False, "false": False, "no": False}


class Codec(Generic[T]):
    """How one setting's value is written into the environment and read back."""

    what = ""  # what to give, for the error a bad value gets

    def text(self, value: T) -> str:
        return str(value)

    def parse(self, raw: str) -> T:
        raise NotImplementedError


class Count(Codec[int]):
    what = "a whole number, at least 1"

    def parse(self, raw: str) -> int:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(self.what)
        return int(raw)


class Seconds(Codec[float]):
    """A duration; ``zero``: 0 is allowed (every step, where the setting is an interval)."""

    def __init__(self, *, zero: bool = False) -> None:
        self.zero = zero
        self.what = "a number of seconds, at least 0" if zero else "a number of seconds, more than 0"

    def text(self, value: float) -> str:
        short = f"{value:g}"
        return short if float(short) == value else repr(float(value))  # exact: reads back the same float

    def parse(self, raw: str) -> float:
        try:
            seconds = float(raw)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.zero):
            raise ValueError(self.what)
        return seconds


class Switch(Codec[bool]):
    what = "on or off"

    def text(self, value: bool) -> str:
        return "on" if value else OFF

    def parse(self, raw: str) -> bool:
        if raw.lower() not in _SWITCH:
            raise ValueError(self.what)
        return _SWITCH[raw.lower()]


class Choice(Codec[str]):
    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices
        self.what = " or ".join(choices)

    def parse(self, raw: str) -> str:
        if raw not in self.choices:
            raise ValueError(self.what)
        return raw


class NodeRange(Codec[tuple[int, int]]):
    what = "MIN:MAX nodes, 1 <= MIN <= MAX"

    def text(self, value: tuple[int, int]) -> str:
        return f"{value[0]}:{value[1]}"

    def parse(self, raw: str) -> tuple[int, int]:
        low, sep, high = raw.partition(":")
        if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
            raise ValueError(self.what)
        return int(low), int(high)


def _setting(env: str, default: Any, codec: Codec[Any], *, can_be_off: bool = False,
             aliases: tuple[str, ...] = (), former: tuple[str, ...] = ()) -> Any:
    """A field of RuntimeSettings: read from ``env`` (an alias first, where one is set; a ``former`` name of
    ``env`` after it); ``can_be_off``: the value ``off`` turns a setting that is on by default off (None). A None
    default means unset (not written)."""
    # pylint: disable-next=invalid-field-call  # a field made for RuntimeSettings' class body, where it is used
    return field(default=default, metadata={"env": env, "codec": codec, "off": can_be_off, "aliases": aliases,
                                            "former": former})


@dataclass(frozen=True)
class RuntimeSettings:  # pylint: disable=too-many-instance-attributes  # one field per setting
    """What the runtime of one job is told, besides where things are: see the module's docstring. The comments
    of core/launch.py say why each backend's figure is what it is."""

    # Checkpoints kept in blob (older ones are deleted once a newer one commits).
    keep: int = _setting(launch.ENV_KEEP, 3, Count())
    # A blob checkpoint every N steps, and/or every S seconds (None: only at a notice and at the end).
    checkpoint_interval_steps: int | None = _setting(launch.ENV_CHECKPOINT_INTERVAL_STEPS, None, Count())
    checkpoint_interval_seconds: float | None = _setting(launch.ENV_CHECKPOINT_INTERVAL_SECONDS, None, Seconds())
    # How often rank 0 writes a progress event to the job's log (0: every step).
    progress_seconds: float = _setting(launch.ENV_PROGRESS_SECONDS, 10.0, Seconds(zero=True))
    # After acknowledging a preemption notice, how long a node waits for its VM to go before training on.
    hold_seconds: float = _setting(launch.ENV_PREEMPTION_HOLD_SECONDS, 60.0, Seconds(zero=True))
    # The node-memory tier (runtime/memory_tier.py).
    memory_tier: bool = _setting(launch.ENV_MEMORY_TIER, True, Switch(), former=(launch.ENV_MEMORY_TIER_FORMER,))
    # How a job survives a membership change (launch.RECOVERY_MODES).
    recovery: str = _setting(launch.ENV_RECOVERY, launch.RECOVERY_RESTART, Choice(launch.RECOVERY_MODES))
    # The job's nodes range: the data layout is checked against every world it may run at (None: unknown).
    nodes: tuple[int, int] | None = _setting(launch.ENV_NODES, None, NodeRange())
    # How long one collective waits for a peer (every process group; outside a job the local figure).
    collective_timeout_seconds: float = _setting(launch.ENV_COLLECTIVE_TIMEOUT,
                                                 launch.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS, Seconds())
    # Restart mode: a peer unheard this long is gone (None: off).
    peer_timeout_seconds: float | None = _setting(launch.ENV_PEER_TIMEOUT, launch.PEER_TIMEOUT_SECONDS, Seconds(),
                                                  can_be_off=True)
    # In-process mode: how long the cross-node collective and commit wait for a peer (None: the collective timeout).
    replica_timeout_seconds: float | None = _setting(launch.ENV_REPLICA_TIMEOUT, None, Seconds(),
                                                     aliases=("TORCHFT_TIMEOUT_SEC",))
    # In-process mode: a participant unheard this long is gone, and the step's collective given up on it (None: the
    # local coordinator's heartbeat timeout).
    replica_heartbeat_timeout_seconds: float | None = _setting(launch.ENV_REPLICA_HEARTBEAT_TIMEOUT, None, Seconds())
    # In-process mode: steps between two checks that the replicas are one, besides the changes of members (None:
    # at those only). A check costs one pass over the parameters and the optimizer's state (memory-bound: ~10 ms
    # for a 19 GB state on a GPU).
    replica_check_steps: int | None = _setting(launch.ENV_REPLICA_CHECK_STEPS, 100, Count(), can_be_off=True)
    # In-process mode: train on with the last quorum while the coordinator does not answer (off: wait for it).
    coordinator_coast: bool = _setting(launch.ENV_COORDINATOR_COAST, True, Switch())
    # In-process mode: a step a node vanished from mid-step is committed with the others' gradients and the
    # vanished slice trained at the next step (off: discarded and trained again; runtime/salvage.py).
    salvage: bool = _setting(launch.ENV_SALVAGE, False, Switch())

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                _check(item.metadata, item.metadata["codec"].text(value))

    @property
    def in_process(self) -> bool:
        return self.recovery == launch.RECOVERY_IN_PROCESS

    @property
    def replica_timeout(self) -> float:
        """The in-process cross-node collective's timeout, in seconds: its own, else the collective timeout."""
        return self.replica_timeout_seconds or self.collective_timeout_seconds

    @property
    def replica_heartbeat_timeout(self) -> float:
        """Seconds a participant of an in-process quorum may go unheard: its own, else the local coordinator's."""
        return self.replica_heartbeat_timeout_seconds or launch.LOCAL_COORDINATOR_HEARTBEAT_TIMEOUT_MS / 1000

    def to_env(self) -> dict[str, str]:
        """Every setting as the runtime reads it back; an unset one (None by default) is left out."""
        env = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                env[item.metadata["env"]] = item.metadata["codec"].text(value)
            elif item.metadata["off"]:
                env[item.metadata["env"]] = OFF
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> RuntimeSettings:
        """The settings ``environ`` holds (what is unset or empty: the default), then ``overrides`` (a script's
        arguments; None there means "not given"). Raises ValueError naming the variable and what to give."""
        found: dict[str, Any] = {}
        for item in fields(cls):
            for name in (*item.metadata["aliases"], item.metadata["env"], *item.metadata["former"]):
                raw = str(environ.get(name) or "").strip()
                if raw:
                    meta = dict(item.metadata, env=name)
                    found[item.name] = None if meta["off"] and raw.lower() == OFF else _check(meta, raw)
                    break
        found.update((key, value) for key, value in overrides.items() if value is not None)
        return cls(**found)


def _check(meta: Mapping[str, Any], raw: str) -> Any:
    try:
        return meta["codec"].parse(raw)
    except ValueError:
        raise ValueError(f"{meta['env']}={raw!r}: give {meta['codec'].what}"
                         + (f", or {OFF}" if meta["off"] else "")) from None


DEFAULTS = RuntimeSettings()


__all__ = ["DEFAULTS", "RuntimeSettings"]
