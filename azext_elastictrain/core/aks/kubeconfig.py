"""Merge a cluster's kubeconfig into the user's, only when they ask (``cluster create --merge-kubeconfig``).

Entries (clusters, users, contexts) of the same name are replaced, others kept; the new context becomes
current. The file is written private (0600) and replaced atomically, so a crash never leaves half a file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def default_path() -> Path:
    """Where kubectl reads: the first file of $KUBECONFIG, else ~/.kube/config."""
    first = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    return Path(first).expanduser() if first else Path.home() / ".kube" / "config"


def merge(existing: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``existing`` with ``new``'s entries added or replaced by name, and ``new``'s current context."""
    merged = dict(existing or {"apiVersion": "v1", "kind": "Config", "preferences": {}})
    for section in ("clusters", "users", "contexts"):
        names = {entry.get("name") for entry in new.get(section) or []}
        merged[section] = [e for e in merged.get(section) or [] if e.get("name") not in names] + list(
            new.get(section) or [])
    if new.get("current-context"):
        merged["current-context"] = new["current-context"]
    return merged


def merge_into_file(kubeconfig: bytes, path: Path | None = None) -> tuple[Path, str]:
    """Merge ``kubeconfig`` into ``path`` (default: :func:`default_path`): (the path, the current context)."""
    import tempfile

    import yaml

    path = path or default_path()
    try:
        new = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        raise ValueError("the cluster's kubeconfig is not valid YAML") from None  # no chaining: it quotes secrets
    existing = None
    if path.exists():
        try:
            existing = yaml.safe_load(path.read_text()) or None
        except yaml.YAMLError:
            raise ValueError(f"{path} is not valid YAML; fix or move it, then run again") from None
    merged = merge(existing, new)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".kubeconfig-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as file:
            yaml.safe_dump(merged, file, default_flow_style=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path, str(merged.get("current-context") or "")
