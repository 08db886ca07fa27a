"""What goes into a checkpoint: the user's state dict as flat, safe items.

A training script's state dict may hold modules (plain, DDP, FSDP2),
optimizers, LR schedulers, ``torch.Generator``s, tensors, numbers, strings,
nested dicts/lists of these, and any object with ``state_dict()`` /
``load_state_dict()``. ``StateTree`` turns it into one flat dict, key ->
tensor or JSON value, the only two kinds of item a checkpoint holds (nothing in
it needs unpickling), and puts loaded values back into the live objects.

Modules and optimizers go through torch's distributed state-dict API
(``torch.distributed.checkpoint.state_dict``): DDP's ``module.`` prefixes are
stripped, FSDP2 parameters stay sharded DTensors (DCP reshards them), and an
optimizer's state is keyed by parameter names and initialised before a load,
so a fresh optimizer gets its moments back. An optimizer is paired with the
smallest module of the state that holds all of its parameters (by identity).

``Snapshotter`` copies the flat dict into CPU memory so that training can go
on while the copy uploads; buffers are reused between saves (at most one save
is in flight), which spares the page faults of a fresh 100s-of-MiB allocation.
"""
from __future__ import annotations

import copy
import json
import random
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, cast

import torch
from torch.distributed.checkpoint.stateful import Stateful

SEP = "."
JSON_SCALARS = (bool, int, float, str, type(None))


class StateError(ValueError):
    """A state dict value that cannot be checkpointed, or a state that does not fit a checkpoint."""


def _lenient() -> Any:
    """torch's options for loading an optimizer's state: not strict. A parameter that never had a gradient has no
    state in what a trained optimizer saved, and torch refuses that when strict; every other key is checked before
    any load (StateTree, the load planner, a peer's keys)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=False)


class TrainingState(Stateful):
    """Model, optimizer and optional LR scheduler as one DCP stateful object (sugar: the plain
    ``{"model": m, "optimizer": o, "scheduler": s}`` dict restores the same way)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            state: dict[str, Any] = {"model": get_model_state_dict(self.model)}
        else:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"])
        else:
            set_state_dict(
                self.model, self.optimizer,
                model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"],
                options=_lenient(),
            )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])


# --------------------------------------------------------------------------- modules and optimizers


def _has_state_dict(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _walk_objects(value: Any, path: str, found: list[tuple[str, Any]]) -> None:
    if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
        found.append((path, value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk_objects(v, f"{path}{SEP}{k}" if path else str(k), found)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _walk_objects(v, f"{path}{SEP}{i}", found)


def modules_in(state: dict[str, Any]) -> list[torch.nn.Module]:
    """Every module of a state dict, TrainingState's included (their buffers are agreed before a save)."""
    found: list[tuple[str, Any]] = []
    _walk_objects(state, "", found)
    modules = [v for _, v in found if isinstance(v, torch.nn.Module)]
    for value in state.values():
        if isinstance(value, TrainingState):
            modules.append(value.model)
    return modules


def optimizers_in(state: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """Every optimizer of a state dict, TrainingState's included."""
    found: list[tuple[str, Any]] = []
    _walk_objects(state, "", found)
    optimizers = [v for _, v in found if isinstance(v, torch.optim.Optimizer)]
    for value in state.values():
        if isinstance(value, TrainingState) and value.optimizer is not None:
            optimizers.append(value.optimizer)
    return optimizers


def schedulers_in(value: Any) -> list[Any]:
    """The LR schedulers of a state: its values, those of nested dicts, lists and tuples, and TrainingState's."""
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return [value]
    if isinstance(value, TrainingState):
        return schedulers_in(value.scheduler)
    if isinstance(value, dict):
        return [s for item in value.values() for s in schedulers_in(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in schedulers_in(item)]
    return []


def pair_optimizers(found: list[tuple[str, Any]]) -> dict[int, torch.nn.Module]:
    """id(optimizer) -> the smallest module of the state holding every parameter it optimizes."""
    modules = [(path, m, {id(p) for p in m.parameters()}) for path, m in found if isinstance(m, torch.nn.Module)]
    pairs: dict[int, torch.nn.Module] = {}
    for path, optimizer in found:
        if not isinstance(optimizer, torch.optim.Optimizer):
            continue
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        holders = [(len(ids), m) for _, m, ids in modules if wanted <= ids]
        if not holders:
            raise StateError(
                f"state[{path!r}]: the optimizer's parameters belong to no single module of the state; "
                "put the module it optimizes into the state dict (several modules: one nn.ModuleDict of them)"
            )
        pairs[id(optimizer)] = min(holders, key=lambda h: h[0])[1]
    return pairs


@dataclass
class _ModuleState:
    module: torch.nn.Module

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state_dict)


@dataclass
class _OptimizerState:
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def state_dict(self) -> dict[str, Any]:
        # Initialises a fresh optimizer's state first, so its template has every moment to load into.
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.module, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.module, self.optimizer, state_dict, options=_lenient())


def _unstepped(value: Any) -> torch.optim.Optimizer | None:
    """The optimizer of an optimizer or TrainingState value, if it has not stepped yet."""
    optimizer = value.optimizer if isinstance(value, TrainingState) else value
    if isinstance(optimizer, torch.optim.Optimizer) and not optimizer.state:
        return optimizer
    return None


@contextmanager
def _as_it_is(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Read an unstepped optimizer's state dict without torch making its state: torch's state-dict API steps a fresh
    optimizer with zero gradients unless a parameter has a gradient, so one parameter gets a zero gradient that
    takes no memory (an expanded scalar) for the read (an FSDP2 DTensor parameter takes it too: the unit tests).
    Where torch refuses that gradient, the state torch made is dropped after the read; either way the optimizer is
    left unstepped."""
    if optimizer is None:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    guarded = None
    if params and all(p.grad is None for p in params):
        try:
            params[0].grad = torch.zeros((), dtype=params[0].dtype, device=params[0].device).expand_as(params[0])
            guarded = params[0]
        except Exception:  # pylint: disable=broad-exception-caught  # torch refused it: drop what it makes, after
            guarded = None
    try:
        yield
    finally:
        if guarded is not None:
            guarded.grad = None
        optimizer.state.clear()


# --------------------------------------------------------------------------- the flat tree


def _is_json(value: Any) -> bool:
    if isinstance(value, JSON_SCALARS):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _describe(path: str) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path.split(SEP))


class StateTree:  # pylint: disable=too-many-instance-attributes  # the flat view and how to rebuild from it
    """One state dict seen as flat items: ``flat`` maps each key to a tensor or a JSON value.

    ``free`` names the items whose type and size come from the checkpoint at a
    restore (plain tensors and JSON values: a list that grew is still restored
    whole); module and optimizer tensors are loaded in place and must fit.

    An optimizer's state of one parameter is a group of items that a source (a
    checkpoint, a memory copy, a peer) may lack as a whole: torch's state-dict API
    gives a fresh optimizer a state for every parameter (the template to load
    into), and a trained one has none for a parameter that never had a gradient
    (an unused head, an expert no batch reached). ``absent_groups`` names those a
    source lacks and ``forget`` drops them, so after the load that parameter has
    no state, as in the run that saved it.

    ``source``: the view of a state that is sent out (a save, a memory copy, a
    peer's heal), not loaded into. An optimizer that has not stepped yet has no
    per-parameter state in it and stays unstepped: torch makes that template by a
    step with zero gradients, and Adam's first real step would then count as its
    second (its bias correction one step off: the first update x0.74) on the node
    that saved and on the one that resumed.
    """

    def __init__(self, state: dict[str, Any], reserved: str | None = None, *, source: bool = False):
        found: list[tuple[str, Any]] = []
        _walk_objects(state, "", found)
        self._pairs = pair_optimizers(found)
        self._source = source
        self.state = state
        self.flat: dict[str, Any] = {}
        self.free: set[str] = set()
        self._origin: dict[str, str] = {}
        self._inner: dict[str, Any] = {}  # path -> what an object's state_dict() gave at flattening
        self.paths: dict[str, tuple[str | int, ...]] = {}  # flat key -> its nesting, for offline DCP tools
        # an optimizer's state of one parameter: the prefix of its keys -> (the "state" dict it is in, its name,
        # that dict's key and nesting)
        self._optimizer_groups: dict[str, tuple[dict[str, Any], str, str, tuple[str | int, ...]]] = {}
        for key, value in state.items():
            if not isinstance(key, str) or not key:
                raise StateError(f"state dict keys must be non-empty strings, got {key!r}")
            if reserved is not None and key == reserved:
                raise StateError(f"state[{key!r}]: this key is reserved for the checkpointer's own state")
            self._flatten(value, key, key, parts=(key,))

    # -- save side: value -> flat items
    def _put(self, path: str, value: Any, origin: str, free: bool, parts: tuple[str | int, ...]) -> None:
        if path in self.flat:
            raise StateError(f"{_describe(origin)}: its key {path!r} collides with another key of the state")
        self.flat[path] = value
        self.paths[path] = parts
        self._origin[path] = origin
        if free:
            self.free.add(path)

    def _adapter(self, value: Any) -> Any:
        if isinstance(value, torch.nn.Module):
            return _ModuleState(value)
        if isinstance(value, torch.optim.Optimizer):
            return _OptimizerState(self._pairs[id(value)], value)
        return value

    def _flatten(self, value: Any, path: str, origin: str, in_place: bool = False,
                 parts: tuple[str | int, ...] = ()) -> None:
        # in_place: a module's or optimizer's tensors are loaded into themselves (DTensor shards
        # included); any other tensor takes its size and dtype from the checkpoint.
        if isinstance(value, torch.Tensor):
            plain = type(value) is torch.Tensor  # pylint: disable=unidiomatic-typecheck  # DTensor etc. are not
            self._put(path, value, origin, free=not in_place and plain, parts=parts)
        elif isinstance(value, torch.Generator):
            self._put(path, value.get_state(), origin, free=True, parts=parts)
        elif _is_json(value) and not isinstance(value, dict):
            self._put(path, value, origin, free=True, parts=parts)
        elif isinstance(value, dict):
            if not value:
                self._put(path, {}, origin, free=True, parts=parts)
            for k, v in value.items():
                self._flatten(v, f"{path}{SEP}{k}", origin, in_place, (*parts, str(k)))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self._flatten(v, f"{path}{SEP}{i}", origin, in_place, (*parts, i))
        elif isinstance(value, (torch.nn.Module, torch.optim.Optimizer)) or _has_state_dict(value):
            unstepped = _unstepped(value) if self._source else None
            try:
                with _as_it_is(unstepped):
                    inner = self._adapter(value).state_dict()
            except Exception as ex:  # noqa: BLE001 - name the key, whatever the object raised
                raise StateError(f"{_describe(path)}: its state_dict() failed: {ex}") from ex
            self._inner[path] = inner
            self._note_optimizer_groups(value, inner, path, parts)
            in_place = isinstance(value, (torch.nn.Module, torch.optim.Optimizer, TrainingState))
            self._flatten(inner, path, path, in_place, parts)
            if unstepped is not None:  # whatever state torch made for the read is not sent
                self.forget({group for group in self._optimizer_groups if group.startswith(f"{path}{SEP}")})
        else:
            raise StateError(
                f"{_describe(path)}: a {type(value).__name__} cannot be checkpointed; a state holds modules, "
                "optimizers, schedulers, torch.Generators, tensors, numbers, strings, dicts/lists of these "
                "and objects with state_dict()/load_state_dict()"
            )

    def _note_optimizer_groups(self, value: Any, inner: Any, path: str, parts: tuple[str | int, ...]) -> None:
        optimizer_sd, prefix = None, path
        if isinstance(value, torch.optim.Optimizer):
            optimizer_sd = inner
        elif isinstance(value, TrainingState) and isinstance(inner, dict):
            optimizer_sd, prefix, parts = inner.get("optim"), f"{path}{SEP}optim", (*parts, "optim")
        states = optimizer_sd.get("state") if isinstance(optimizer_sd, dict) else None
        if isinstance(states, dict):
            where = (f"{prefix}{SEP}state", (*parts, "state"))
            for name in states:
                self._optimizer_groups[f"{prefix}{SEP}state{SEP}{name}{SEP}"] = (states, name, *where)

    @property
    def optimizer_groups(self) -> set[str]:
        """The key prefixes of every optimizer's state of one parameter (see the class)."""
        return set(self._optimizer_groups)

    def absent_groups(self, available: Iterable[str]) -> set[str]:
        """The optimizer state groups (key prefixes) of which ``available`` holds no key at all."""
        present = set(available)
        return {group for group in self._optimizer_groups
                if not any(key.startswith(group) for key in present)}

    def group_keys(self, groups: Iterable[str]) -> set[str]:
        """The flat keys of these optimizer state groups."""
        prefixes = tuple(groups)
        return {key for key in self.flat if prefixes and key.startswith(prefixes)}

    def forget(self, groups: Iterable[str]) -> None:
        """Drop these optimizer state groups: their parameters have no state after the load (see the class). The
        tree is then what flattening the state without them gives: an optimizer left with no state at all has its
        one empty ``state`` item, as one that never had any (plain SGD, an unstepped optimizer's source view)."""
        groups = set(groups)
        for key in self.group_keys(groups):
            del self.flat[key]
            self.free.discard(key)
            self.paths.pop(key, None)
            self._origin.pop(key, None)
        for group in groups:
            states, name, path, parts = self._optimizer_groups.pop(group)
            states.pop(name, None)
            if not states and path not in self.flat:
                self._put(path, {}, path, free=True, parts=parts)

    @property
    def json_keys(self) -> set[str]:
        """The plain values among the items (kept as JSON text in the checkpoint)."""
        return {k for k, v in self.flat.items() if not isinstance(v, torch.Tensor)}

    # -- restore side: loaded flat items -> live objects
    def apply(self, loaded: dict[str, Any]) -> None:
        """Put ``loaded`` (every key of ``flat``) back into the live state, objects in place."""
        for key in list(self.state):
            self.state[key] = self._rebuild(self.state[key], key, loaded)

    def _rebuild(self, live: Any, path: str, loaded: dict[str, Any]) -> Any:
        if path in loaded and path in self.flat:
            return self._leaf(live, loaded[path])
        if isinstance(live, dict):
            for k in list(live):
                live[k] = self._rebuild(live[k], f"{path}{SEP}{k}", loaded)
            return live
        if isinstance(live, list):
            for i, v in enumerate(live):
                live[i] = self._rebuild(v, f"{path}{SEP}{i}", loaded)
            return live
        if isinstance(live, tuple):
            items = [self._rebuild(v, f"{path}{SEP}{i}", loaded) for i, v in enumerate(live)]
            return type(live)(*items) if hasattr(live, "_fields") else tuple(items)
        if path not in self._inner:  # a value that was not in the state when it was flattened
            return live
        self._adapter(live).load_state_dict(self._rebuild(self._inner[path], path, loaded))
        return live

    @staticmethod
    def _leaf(live: Any, value: Any) -> Any:
        if isinstance(live, torch.Generator):
            live.set_state(value)
            return live
        if isinstance(live, torch.Tensor) and isinstance(value, torch.Tensor):
            if value is live:
                return live
            plain = type(live) is torch.Tensor  # pylint: disable=unidiomatic-typecheck  # not a DTensor/Parameter
            if live.shape == value.shape and live.dtype == value.dtype and plain:
                with torch.no_grad():
                    live.copy_(value)
                return live
            return value
        return _like(live, value)


def _like(live: Any, value: Any) -> Any:
    """A JSON value with the tuples (named ones too) the live value had where it has lists."""
    if isinstance(value, list) and isinstance(live, (list, tuple)):
        items = [_like(live[i], v) if i < len(live) else v for i, v in enumerate(value)]
        if isinstance(live, tuple):
            return type(live)(*items) if hasattr(live, "_fields") else tuple(items)
        return items
    if isinstance(value, dict) and isinstance(live, dict):
        return {k: _like(live[k], v) if k in live else v for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- RNG states, as tensors


def capture_rng() -> dict[str, Any]:
    """This process's random generators (Python, NumPy if loaded, torch CPU and CUDA) as tensors and JSON."""
    version, mt, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": torch.tensor(mt, dtype=torch.int64),
        "python_extra": [version, gauss],
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy

        # the legacy tuple: the global RandomState is always an MT19937 (a dict only for other bit generators)
        kind, keys, pos, has_gauss, cached = cast("tuple[str, numpy.ndarray[Any, Any], int, int, float]",
                                                  numpy.random.get_state())
        state["numpy"] = torch.from_numpy(keys.astype("int64"))
        state["numpy_extra"] = [kind, int(pos), int(has_gauss), float(cached)]
    except ImportError:  # pragma: no cover - numpy ships with the train extra
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch: untyped
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators from ``capture_rng``'s items (its dict, or flat: "python", "cuda.0", ...)."""
    version, gauss = state["python_extra"]
    random.setstate((int(version), tuple(int(v) for v in state["python"].tolist()), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        kind, pos, has_gauss, cached = state["numpy_extra"]
        keys = state["numpy"].numpy().astype("uint32")
        numpy.random.set_state((str(kind), keys, int(pos), int(has_gauss), float(cached)))
    cuda = cuda_rng_states(state)
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def cuda_rng_states(state: dict[str, Any]) -> list[torch.Tensor]:
    """The CUDA generators' states, one per device, from ``capture_rng``'s own dict (a list under "cuda": what
    the in-process mode's heal and discarded step restore) or a checkpoint's flat items ("cuda.0", "cuda.1")."""
    if isinstance(state.get("cuda"), (list, tuple)):
        return list(state["cuda"])
    return [state[k] for k in sorted((k for k in state if k.startswith("cuda" + SEP)),
                                     key=lambda k: int(k.split(SEP)[1]))]


# --------------------------------------------------------------------------- the CPU snapshot


class Snapshotter:  # pylint: disable=too-few-public-methods  # one operation with buffers kept between saves
    """Copies flat state dicts to CPU, reusing its buffers from one save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def snapshot(self, flat: dict[str, Any]) -> dict[str, Any]:
        copied = {key: self._copy(key, value) for key, value in flat.items()}
        for stale in set(self._buffers) - set(flat):
            del self._buffers[stale]
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch: untyped
            torch.cuda.synchronize()  # the non-blocking device->host copies must land
        return copied

    def _copy(self, key: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return copy.deepcopy(value)
        tensor = value.detach()
        # DTensor / ShardedTensor (subclasses): let them copy themselves
        if type(tensor) is not torch.Tensor:  # pylint: disable=unidiomatic-typecheck
            return tensor.to("cpu", copy=True)
        buf = self._buffers.get(key)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda)
            self._buffers[key] = buf
        buf.copy_(tensor, non_blocking=tensor.is_cuda)
        return buf


def json_tensor(value: Any, key: str) -> torch.Tensor:
    """A plain value as it lies in a checkpoint: its JSON text (NaN and infinities as Python writes
    them) in a uint8 tensor, so that every item of a checkpoint is a tensor."""
    try:
        raw = json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as ex:
        raise StateError(f"{_describe(key)}: not JSON-serialisable: {ex}") from ex
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def json_value(item: Any, key: str) -> Any:
    """The plain value ``json_tensor`` stored; StateError if the item is not one."""
    if not (isinstance(item, torch.Tensor) and item.dtype == torch.uint8 and item.dim() == 1):
        raise StateError(f"checkpoint item {key!r} is not a plain (JSON) value")
    try:
        return json.loads(item.numpy().tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as ex:
        raise StateError(f"checkpoint item {key!r} is not valid JSON: {ex}") from ex
