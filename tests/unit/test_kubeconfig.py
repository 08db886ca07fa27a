"""--merge-kubeconfig: entries replaced by name, others kept, file private, context switched."""
from __future__ import annotations

import stat

import yaml

from azext_elastictrain.core.aks.kubeconfig import merge, merge_into_file

NEW = {"clusters": [{"name": "spot", "cluster": {"server": "https://spot"}}],
       "users": [{"name": "clusterUser_spot", "user": {"token": "t2"}}],
       "contexts": [{"name": "spot", "context": {"cluster": "spot", "user": "clusterUser_spot"}}],
       "current-context": "spot"}


def test_merge_replaces_same_names_and_keeps_the_rest():
    old = {"apiVersion": "v1", "kind": "Config", "current-context": "other",
           "clusters": [{"name": "spot", "cluster": {"server": "https://old"}}, {"name": "other", "cluster": {}}],
           "users": [{"name": "clusterUser_spot", "user": {"token": "t1"}}], "contexts": []}
    merged = merge(old, NEW)
    assert [c["name"] for c in merged["clusters"]] == ["other", "spot"]
    assert merged["clusters"][1]["cluster"]["server"] == "https://spot"
    assert merged["users"] == NEW["users"] and merged["current-context"] == "spot"


def test_merge_into_a_new_private_file(tmp_path):
    path = tmp_path / "kube" / "config"
    written, context = merge_into_file(yaml.safe_dump(NEW).encode(), path)
    assert (written, context) == (path, "spot")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text())["users"][0]["user"]["token"] == "t2"
