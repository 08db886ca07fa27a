"""az elastictrain checkpoint list|show|verify through the real az, over checkpoints the runtime wrote."""
from __future__ import annotations

import uuid

import pytest
import torch

from azext_elastictrain.core import layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime import Checkpointer


@pytest.fixture
def job_url(azurite, container_url):
    """A job with checkpoints of steps 10, 20, 30 written by the real runtime."""
    url = f"{container_url}/job-{uuid.uuid4().hex[:6]}"
    store = BlobStore.from_url(url, connection_string=azurite.connection_string)
    ckpt = Checkpointer(store, keep=5, watcher=None, events=False)
    state = {"weights": {"w": torch.zeros(1000)}}
    for step in (10, 20, 30):
        state["weights"]["w"] += 1
        ckpt.save(step, state, blocking=True)
    ckpt.close()
    yield url, store
    store.close()


def _env(azurite):
    return {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}


def test_list_shows_every_checkpoint_with_its_status(az, azurite, job_url):
    url, _ = job_url
    listed = az.json("elastictrain", "checkpoint", "list", "--url", url, env=_env(azurite))
    assert [(c["step"], c["status"]) for c in listed] == [(10, "complete"), (20, "complete"), (30, "complete")]
    assert all(c["sizeBytes"] > 4000 and c["worldSize"] == 1 for c in listed)
    table = az("elastictrain", "checkpoint", "list", "--url", url, "-o", "table", env=_env(azurite)).stdout
    assert "Step" in table and "complete" in table and "30" in table


def test_verify_reads_back_and_flags_a_damaged_file(az, azurite, job_url):
    url, store = job_url
    manifest = layout.Manifest.from_bytes(store.read(layout.manifest_name(store.prefix, 30)))
    victim = layout.checkpoint_prefix(store.prefix, 30) + next(f.path for f in manifest.files if f.path.endswith(".distcp"))
    size = next(f.size for f in manifest.files if victim.endswith(f.path))
    store.delete([victim])
    store.create(victim, b"\0" * size)  # same size, wrong bytes

    verified = {c["step"]: c for c in az.json("elastictrain", "checkpoint", "verify", "--url", url, env=_env(azurite))}
    assert verified[10]["verified"] is True and verified[20]["verified"] is True
    assert verified[30]["verified"] is False and verified[30]["status"] == "damaged"
    assert any("checksum" in p for p in verified[30]["problems"])


def test_show_gives_files_and_a_missing_step_exits_3(az, azurite, job_url):
    url, _ = job_url
    shown = az.json("elastictrain", "checkpoint", "show", "--url", url, "--step", "20", env=_env(azurite))
    assert shown["step"] == 20 and shown["status"] == "complete"
    assert any(f["path"].endswith(".distcp") for f in shown["fileList"])
    missing = az("elastictrain", "checkpoint", "show", "--url", url, "--step", "25", check=False, env=_env(azurite))
    assert missing.returncode == 3, missing.stderr
    assert "no checkpoint of step 25" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("url, expected", [
    ("not-a-url", "not a blob URL"),
    ("https://", "not a blob URL"),
    ("http://127.0.0.1:1/devstoreaccount1/c/job", "cannot reach blob storage"),
])
def test_bad_urls_are_clear_errors_not_tracebacks(az, azurite, url, expected):
    env = _env(azurite) if "127.0.0.1:1/" in url else {}
    if "127.0.0.1:1/" in url:
        env["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string.replace(
            azurite.blob_endpoint, "http://127.0.0.1:1/devstoreaccount1")
    result = az("elastictrain", "checkpoint", "list", "--url", url, check=False, env=env, timeout=180)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _steps(az, azurite, url):
    return [c["step"] for c in az.json("elastictrain", "checkpoint", "list", "--url", url, env=_env(azurite))]


def test_prune_shows_the_plan_asks_and_only_then_deletes(az, azurite, job_url):
    url, _ = job_url
    prune = ("elastictrain", "checkpoint", "prune", "--url", url, "--keep-last", "1")

    plan = az.json(*prune, "--dry-run", env=_env(azurite))
    assert [c["step"] for c in plan["delete"]] == [10, 20] and plan["keep"] == [30] and not plan["deleted"]
    assert _steps(az, azurite, url) == [10, 20, 30]

    unconfirmed = az(*prune, check=False, env=_env(azurite))  # no TTY to ask on, no --yes
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr, unconfirmed.stderr
    assert _steps(az, azurite, url) == [10, 20, 30]

    done = az.json(*prune, "--yes", env=_env(azurite))
    assert done["deleted"] and done["bytesFreed"] > 0
    assert _steps(az, azurite, url) == [30]


@pytest.mark.parametrize("args, expected", [
    ((), "nothing to prune"),
    (("--keep-last", "0"), "would delete every checkpoint"),
    (("--older-than", "7x"), "invalid duration"),
])
def test_prune_refuses_bad_input_and_deletes_nothing(az, azurite, job_url, args, expected):
    url, _ = job_url
    result = az("elastictrain", "checkpoint", "prune", "--url", url, "--yes", *args, check=False, env=_env(azurite))
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert _steps(az, azurite, url) == [10, 20, 30]


@pytest.mark.parametrize("command", [("list",), ("prune", "--keep-last", "1", "--yes")])
def test_a_url_of_another_account_than_the_connection_string_is_refused(az, azurite, job_url, command):
    url, _ = job_url
    # the same container and job in another account: the SDK would open them in the connection string's account
    container_and_job = url.split("/devstoreaccount1/", 1)[1]
    elsewhere = f"https://prodacct.blob.core.windows.net/{container_and_job}"
    result = az("elastictrain", "checkpoint", *command, "--url", elsewhere, check=False, env=_env(azurite))
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "'prodacct'" in result.stderr and "'devstoreaccount1'" in result.stderr, result.stderr
    assert result.stdout.strip() == "", "nothing listed"
    assert _steps(az, azurite, url) == [10, 20, 30], "nothing deleted in the connection string's account"


def _damage(store, step: int) -> None:
    manifest = layout.Manifest.from_bytes(store.read(layout.manifest_name(store.prefix, step)))
    entry = next(f for f in manifest.files if f.path.endswith(".distcp"))
    victim = layout.checkpoint_prefix(store.prefix, step) + entry.path
    store.delete([victim])
    store.create(victim, b"\0" * entry.size)  # same size, wrong bytes


def test_download_gives_a_plain_dcp_folder_that_torch_loads(az, azurite, job_url, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    url, _ = job_url
    got = az.json("elastictrain", "checkpoint", "download", "--url", url, "--dest", str(tmp_path),
                  env=_env(azurite))
    folder = tmp_path / layout.step_dir(30)
    assert got["step"] == 30 and got["verified"] is True and got["path"] == str(folder)  # the newest by default
    assert (folder / ".metadata").is_file() and (folder / layout.MANIFEST).is_file()
    dcp_to_torch_save(folder, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(loaded["weights"]["w"], torch.full((1000,), 3.0))

    again = az("elastictrain", "checkpoint", "download", "--url", url, "--dest", str(tmp_path), check=False,
               env=_env(azurite))
    assert again.returncode != 0 and "already exists" in again.stderr and "Traceback" not in again.stderr

    older = az.json("elastictrain", "checkpoint", "download", "--url", url, "--step", "10", "--dest",
                    str(tmp_path), env=_env(azurite))
    assert older["step"] == 10 and (tmp_path / layout.step_dir(10) / ".metadata").is_file()


def test_a_damaged_checkpoint_downloads_nothing(az, azurite, job_url, tmp_path):
    url, store = job_url
    _damage(store, 30)
    dest = tmp_path / "dest"
    result = az("elastictrain", "checkpoint", "download", "--url", url, "--step", "30", "--dest", str(dest),
                check=False, env=_env(azurite))
    assert result.returncode != 0 and "step 30 is damaged" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not dest.exists() or list(dest.iterdir()) == []  # no partial folder left behind
    missing = az("elastictrain", "checkpoint", "download", "--url", url, "--step", "25", "--dest", str(dest),
                 check=False, env=_env(azurite))
    assert missing.returncode == 3 and "no checkpoint of step 25" in missing.stderr
