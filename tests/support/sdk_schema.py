"""Request bodies checked against the installed SDK's models, as ARM checks them against its schema.

The SDKs (azure-mgmt-containerservice, azure-mgmt-storage, ...) are generated from the same specifications the
service validates with: each model field has its wire name (``_rest_name``) and its visibility (``["read"]`` for
read-only fields such as provisioningState). ``problems(body, Model)`` walks a wire-format body and names every
field the model does not have (ARM answers 400 for an unknown property of most types) and every read-only field
sent (ignored or refused by the service; either way a client bug).
"""
from __future__ import annotations

import typing


def problems(body: typing.Any, model: type, path: str = "") -> list[str]:
    if not isinstance(body, dict):
        return []
    fields = _fields(model)
    found = []
    for key, value in body.items():
        where = f"{path}.{key}" if path else key
        field = fields.get(key)
        if field is None:
            found.append(f"{where}: not a field of {model.__name__}")
            continue
        name, rest = field
        if list(getattr(rest, "_visibility", None) or []) == ["read"]:
            found.append(f"{where}: read-only in {model.__name__}")
            continue
        found += _walk(value, _hints(model).get(name), where, model)
    return found


def _walk(value, hint, where: str, model: type | None = None) -> list[str]:
    if isinstance(hint, (typing.ForwardRef, str)):  # "_models.X": resolve in the package of the model naming it
        hint = _resolve(hint.__forward_arg__ if isinstance(hint, typing.ForwardRef) else hint, model)
    if hint is None:
        return []
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return _walk(value, args[0], where, model) if len(args) == 1 else []
    if origin in (list, typing.List) and isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _walk(item, args[0], f"{where}[{i}]", model)]
    if origin in (dict, typing.Dict) and isinstance(value, dict):
        return [p for k, item in value.items() for p in _walk(item, args[1], f"{where}.{k}", model)]
    if isinstance(hint, type) and hasattr(hint, "_attr_to_rest_field") or _is_model(hint):
        return problems(value, hint, where)
    return []


def _resolve(name: str, model: type | None):
    import importlib

    if model is None:
        return None
    package = importlib.import_module(model.__module__.rsplit(".", 1)[0])
    target = package
    for part in name.split(".")[1:] if name.startswith("_models.") else [name]:
        target = getattr(target, part, None)
    return target if isinstance(target, type) else None


def _is_model(hint) -> bool:
    return isinstance(hint, type) and any(b.__name__ == "Model" for b in hint.__mro__)


def _fields(model: type) -> dict[str, tuple[str, typing.Any]]:
    """wire name -> (attribute name, rest field) of a model class (a throwaway instance holds the table)."""
    table = getattr(model, "_attr_to_rest_field", None)
    if table is None:
        table = model.__new__(model)._attr_to_rest_field  # noqa: the table is set per class on first use
    return {rest._rest_name: (attr, rest) for attr, rest in table.items()}


def _hints(model: type) -> dict:
    """attribute name -> its type, from the annotations of the class and its bases (generated code writes them as
    strings such as ``"_models.AgentPoolMode"``; they resolve in the model's package)."""
    import importlib
    import sys

    hints: dict = {}
    for cls in reversed(model.__mro__):
        module = sys.modules[cls.__module__]
        namespace = {**vars(typing), **module.__dict__}
        package = cls.__module__.rsplit(".", 1)[0]
        namespace.setdefault("_models", importlib.import_module(package))
        for name, annotation in (cls.__dict__.get("__annotations__") or {}).items():
            try:
                hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
            except Exception:  # noqa: BLE001  an annotation we cannot resolve: its value is not walked
                hints[name] = None
    return hints
