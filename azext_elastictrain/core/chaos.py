"""Chaos on purpose: Spot evictions at a rate for a duration, planned, then carried out and reported.

``plan_schedule(spec)`` is pure: when each eviction comes (one every ``60 / rate`` seconds from the start,
the first one interval in), which of them get a notice (exactly ``round(share x count)`` of them, chosen by
the seed), and a number per eviction that picks the node among those running then (the nodes change as
replacements join, so the name is chosen at that moment, from the seed). One seed, one schedule.

``run_schedule(schedule, evictor, ...)`` carries it out through a backend's ``ScheduleEvictor``: at each time,
evict; follow the job until it trains again (recovery seconds, steps lost: ``core.eventlog.recovery``'s reading of
the events); give the capacity back after its delay and follow the job back to its size; print a line for
each as it goes; at the end, the job's goodput from its events (``core.eventlog.goodput``). A stop request (Ctrl-C:
``stop_on_interrupt``) ends it between steps: an eviction under way is finished, its capacity is given back
at once, and the report so far is returned. Pure but for the clock and the evictor.
"""
from __future__ import annotations

import math
import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NotRequired, Protocol, TypedDict

from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS
from azext_elastictrain.core.spec import SpecError

MAX_EVICTIONS = 1000  # a schedule is for minutes or hours of chaos, not a typo's millions


class ScheduleError(SpecError):
    """A schedule that cannot be run as asked; the message says which value and what to give instead."""


class Skipped(Exception):
    """An eviction that is due but cannot be done now (e.g. the job runs only its minimum of nodes)."""


class FollowStopped(Exception):
    """Following a recovery was stopped (Ctrl-C) before the job trained again."""


@dataclass(frozen=True)
class ScheduleSpec:
    """``rate`` evictions a minute for ``duration`` seconds; ``notice_share`` of them with a notice of
    ``notice_seconds``; capacity back ``replace_after`` seconds after each (None: the platform decides)."""

    rate: float
    duration: float
    notice_share: float = 0.5
    notice_seconds: float = AZURE_NOTICE_SECONDS
    replace_after: float | None = 30.0
    seed: int | None = None

    @classmethod
    def asked(cls, rate: float, duration: float, **given: Any) -> "ScheduleSpec":
        """The spec of a command's values: one left out (None) takes the default above."""
        return cls(rate, duration, **{k: v for k, v in given.items() if v is not None})

    @property
    def interval(self) -> float:
        return 60.0 / self.rate

    def __post_init__(self) -> None:
        """Raises ScheduleError for the first bad value: a bad spec never exists, nothing is planned from one."""
        rate, duration = self.rate, self.duration
        if not _finite(rate) or rate <= 0:
            raise ScheduleError(f"--rate {rate:g}: give evictions per minute, more than 0 (e.g. --rate 1 for one "
                                "a minute, --rate 0.1 for one every 10 minutes)")
        if not _finite(duration) or duration <= 0:
            raise ScheduleError(f"--duration {duration:g}: give the seconds the schedule runs, more than 0")
        if not _finite(self.notice_share) or not 0 <= self.notice_share <= 1:
            raise ScheduleError(f"--notice-share {self.notice_share:g}: give the share of evictions that get a "
                                "notice, from 0 (none) to 1 (all)")
        if not _finite(self.notice_seconds) or self.notice_seconds < 0:
            raise ScheduleError(f"--notice-seconds {self.notice_seconds:g}: give 0 or more seconds (Azure gives 30)")
        if self.replace_after is not None and (not _finite(self.replace_after) or self.replace_after < 0):
            raise ScheduleError(f"--replace-after {self.replace_after:g}: give 0 or more seconds after each "
                                "eviction for the capacity to come back")
        if duration + 1e-9 < self.interval:
            raise ScheduleError(f"--duration {duration:g}s is too short for one eviction at --rate {rate:g} a "
                                f"minute (one every {self.interval:g}s, the first {self.interval:g}s in): give "
                                f"--duration {math.ceil(self.interval)} or more, or a higher --rate")
        if self.count > MAX_EVICTIONS:
            raise ScheduleError(f"--rate {rate:g} a minute for {duration:g}s makes {self.count} evictions: at most "
                                f"{MAX_EVICTIONS} in one schedule; lower --rate or --duration")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise ScheduleError(f"--seed {self.seed!r}: give a whole number, 0 or more")

    @property
    def count(self) -> int:
        return int(math.floor(self.duration / self.interval + 1e-9))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ScheduledEviction:
    """One eviction: ``at`` seconds from the start, a notice of ``notice_seconds`` (0: none), capacity back
    ``replace_after`` seconds later (None: the platform's), ``pick`` in [0, 1) chooses the node."""

    index: int
    at: float
    notice_seconds: float
    replace_after: float | None
    pick: float

    def choose(self, running: list[str]) -> str:
        """The node this eviction takes among those running now (by name, so a rerun picks alike)."""
        names = sorted(running)
        return names[min(len(names) - 1, int(self.pick * len(names)))]


@dataclass(frozen=True)
class Schedule:
    spec: ScheduleSpec
    seed: int
    evictions: tuple[ScheduledEviction, ...]

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {"ratePerMinute": spec.rate, "intervalSeconds": round(spec.interval, 3), "durationSeconds":
                spec.duration, "noticeShare": spec.notice_share, "noticeSeconds": spec.notice_seconds,
                "replaceAfterSeconds": spec.replace_after, "seed": self.seed,
                "evictions": [{"index": e.index, "atSeconds": round(e.at, 3), "noticeSeconds": e.notice_seconds,
                               "replaceAfterSeconds": e.replace_after} for e in self.evictions]}


def plan_schedule(spec: ScheduleSpec) -> Schedule:
    """The evictions of ``spec``, in time order. Without a seed one is drawn and recorded, so the printed
    schedule can be run again with ``--seed``. Raises ScheduleError."""
    seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    count = spec.count
    noticed = set(rng.sample(range(count), int(math.floor(spec.notice_share * count + 0.5))))
    picks = [rng.random() for _ in range(count)]
    evictions = tuple(ScheduledEviction(index=i + 1, at=(i + 1) * spec.interval,
                                        notice_seconds=spec.notice_seconds if i in noticed else 0.0,
                                        replace_after=spec.replace_after, pick=picks[i])
                      for i in range(count))
    return Schedule(spec, seed, evictions)


# -- carrying it out ------------------------------------------------------------------------------------------

class ScheduleEvictor(Protocol):
    """What a backend does for the schedule (``Backend.run_schedule`` builds one over its own clients)."""

    def evict(self, item: ScheduledEviction) -> dict[str, Any]:
        """Evict the node ``item.choose`` picks among the running ones, with ``item``'s notice; return the
        eviction (``node``, ``startedAt``/``evictedAt`` epoch seconds, ...). Raises Skipped when none can go."""

    def recovery(self, eviction: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
        """Follow the job until it trains again (``outageSeconds``, ``stepsLost``, ...); raises
        FollowStopped once ``stop`` is set."""

    def capacity_back(self, item: ScheduledEviction, eviction: dict[str, Any],
                      stop: threading.Event) -> dict[str, Any] | None:
        """Bring the capacity back ``item.replace_after`` s after the eviction (at once when ``stop`` is set)
        and follow the job back to its size; None where the platform brings it back by itself."""

    def events(self) -> list[dict[str, Any]]:
        """The job's events (its current run), for the goodput at the end."""


def sleeper(stop: threading.Event) -> Callable[[float], None]:
    """A ``sleep`` for polling loops that ends them with FollowStopped once ``stop`` is set."""
    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise FollowStopped()
    return sleep


@contextmanager
def stop_on_interrupt() -> Iterator[threading.Event]:
    """An Event that Ctrl-C sets instead of raising, so a schedule ends between its steps; a second Ctrl-C
    interrupts at once. Outside the main thread (tests) no handler is installed."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(_signum: int, _frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


class ScheduleReport(TypedDict):
    """What a schedule that ran shows: the schedule, whether it was stopped, each eviction as done, the job's
    goodput after (None, with why, where its events could not be read) and a summary per kind of eviction."""

    schedule: dict[str, Any]  # Schedule.to_dict
    stopped: bool
    ranSeconds: float
    evictions: list[dict[str, Any]]
    goodput: dict[str, Any] | None  # core.eventlog.goodput.goodput
    goodputError: NotRequired[str]
    summary: dict[str, Any]  # summarize


class _GoodputError(TypedDict, total=False):
    goodputError: str


def run_schedule(schedule: Schedule, evictor: ScheduleEvictor, *, stop: threading.Event | None = None,
                 say: Callable[[str], None] = lambda line: None,
                 clock: Callable[[], float] = time.time) -> ScheduleReport:
    """Carry the schedule out; ``say`` gets a line per eviction, recovery and replacement as they happen."""
    from azext_elastictrain.core.eventlog.goodput import goodput

    stop = stop or threading.Event()
    start = clock()
    done: list[dict[str, Any]] = []
    total = len(schedule.evictions)
    for item in schedule.evictions:
        if stop.wait(max(0.0, start + item.at - clock())):
            break
        record: dict[str, Any] = {"index": item.index, "plannedAtSeconds": round(item.at, 2),
                                  "atSeconds": round(clock() - start, 2), "noticeSeconds": item.notice_seconds}
        done.append(record)
        try:
            eviction = evictor.evict(item)
        except Skipped as why:
            record["skipped"] = str(why)
            say(f"eviction {item.index}/{total} at +{record['atSeconds']:.0f}s: skipped, {why}")
            continue
        record.update(_shown(eviction))
        say(f"eviction {item.index}/{total} at +{record['atSeconds']:.0f}s: {eviction['node']} "
            + _how(item, eviction))
        if not stop.is_set():
            record["recovery"] = _follow(evictor.recovery, eviction, stop)
            say(f"  {_recovery_line(record['recovery'])}")
        back = _follow(evictor.capacity_back, item, eviction, stop)
        if back is not None:
            record["capacityBack"] = back
            say(f"  {_capacity_line(back)}")
    if not stop.is_set():
        stop.wait(max(0.0, start + schedule.spec.duration - clock()))
    stopped, ran = stop.is_set(), round(clock() - start, 2)
    error = _GoodputError()
    try:
        found = goodput(evictor.events())
    except Exception as ex:  # pylint: disable=broad-exception-caught  # evicted: say why the goodput is unknown
        found, error = None, _GoodputError(goodputError=f"the job's events cannot be read: {ex}")
    result: ScheduleReport = {"schedule": schedule.to_dict(), "stopped": stopped, "ranSeconds": ran,
                              "evictions": done, "goodput": found, **error, "summary": summarize(done)}
    say(goodput_line(result))
    return result


def _shown(eviction: dict[str, Any]) -> dict[str, Any]:
    """The eviction as printed: epoch seconds as ISO 8601 times (they stay inside as numbers)."""
    from azext_elastictrain.core.eventlog.view import iso_time

    shown = {k: v for k, v in eviction.items() if k not in ("startedAt", "requestedAt", "pid")}
    if isinstance(shown.get("evictedAt"), (int, float)):
        shown["evictedAt"] = iso_time(shown["evictedAt"], millis=True)
    return shown


def _follow(step: Callable[..., dict[str, Any] | None], *args: Any) -> dict[str, Any] | None:
    try:
        return step(*args)
    except FollowStopped:
        return {"stopped": True}
    except Exception as ex:  # pylint: disable=broad-exception-caught  # one recovery not seen ends no schedule
        return {"error": str(ex)}


def _how(item: ScheduledEviction, eviction: dict[str, Any]) -> str:
    if not item.notice_seconds:
        return "evicted without notice"
    acked = eviction.get("acknowledgedAfterSeconds")
    return (f"evicted after a {item.notice_seconds:g}s notice" +
            (f" (acknowledged after {acked:g}s)" if acked is not None else ""))


def _recovery_line(recovery: dict[str, Any] | None) -> str:
    recovery = recovery or {}
    if recovery.get("stopped"):
        return "recovery not followed: stopped"
    if recovery.get("outageSeconds") is None:
        return f"recovery not measured: {recovery.get('error') or recovery.get('eventsError') or 'no events'}"
    return (f"outage {recovery['outageSeconds']:g}s (last step to first step), world size "
            f"{recovery.get('worldSize')}, "
            f"{recovery.get('stepsLost')} step(s) lost (resumed from step {recovery.get('resumedFromStep')})")


def _capacity_line(back: dict[str, Any]) -> str:
    if back.get("error"):
        return f"capacity back, not followed: {back['error']}"
    nodes = ", ".join(r["node"] for r in back.get("replacements") or [])
    full = back.get("fullSize") or {}
    if "seconds" in full:
        outage = full.get("outageSeconds")
        return (f"capacity back: {nodes} joined; full size {full['worldSize']} again after {full['seconds']:g}s"
                + (f" (outage {outage:g}s)" if isinstance(outage, (int, float)) else ""))
    return f"capacity back: {nodes} joined" + (" (stopped before the job grew)" if back.get("stopped") else "")


def summarize(done: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of eviction, what was measured: counts, median outage seconds, steps lost."""
    from statistics import median

    out: dict[str, Any] = {"evicted": sum(1 for r in done if "node" in r),
                           "skipped": sum(1 for r in done if "skipped" in r)}
    for kind, with_notice in (("withNotice", True), ("withoutNotice", False)):
        measured = [r["recovery"] for r in done if "node" in r and bool(r["noticeSeconds"]) == with_notice
                    and isinstance((r.get("recovery") or {}).get("outageSeconds"), (int, float))]
        out[kind] = {"recovered": len(measured),
                     "medianOutageSeconds": round(median(m["outageSeconds"] for m in measured), 2)
                     if measured else None,
                     "stepsLost": [m.get("stepsLost") for m in measured]}
    ups = [r["capacityBack"]["fullSize"]["seconds"] for r in done
           if isinstance(((r.get("capacityBack") or {}).get("fullSize") or {}).get("seconds"), (int, float))]
    out["fullSizeAgainSeconds"] = ups
    out["scaleUpOutageSeconds"] = [r["capacityBack"]["fullSize"]["outageSeconds"] for r in done
                                   if isinstance(((r.get("capacityBack") or {}).get("fullSize") or {})
                                                 .get("outageSeconds"), (int, float))]
    return out


def goodput_line(result: Mapping[str, Any]) -> str:
    found = result.get("goodput")
    head = "stopped: " if result.get("stopped") else ""
    if not found or found.get("goodput") is None:
        return f"{head}goodput unknown: {result.get('goodputError') or 'the job has not trained yet'}"
    lost = ", ".join(f"{k} {v:g}" for k, v in found["lostRankSeconds"].items() if v)
    return (f"{head}goodput {found['goodput']:.1%} of the job's node-seconds ({found['stepsLost']} step(s) "
            f"retrained; rank-seconds lost: {lost or 'none'})")
