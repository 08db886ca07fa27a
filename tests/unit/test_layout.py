"""The blob layout of a job and the checkpoint manifest schema (pure, no I/O)."""
from __future__ import annotations

import json

import pytest

from azext_elastictrain.core import layout
from azext_elastictrain.core.layout import FileEntry, Manifest, ManifestError


# --------------------------------------------------------------------------- steps


@pytest.mark.parametrize(
    "step, folder",
    [(0, "000000000000"), (1, "000000000001"), (123456, "000000123456"), (10**12 - 1, "999999999999")],
)
def test_step_dir_is_twelve_zero_padded_digits(step: int, folder: str) -> None:
    assert layout.step_dir(step) == folder
    assert len(folder) == layout.STEP_DIGITS


def test_step_dirs_sort_like_their_steps() -> None:
    steps = [0, 9, 10, 99, 100, 1_000_000, 10**11]
    assert sorted(layout.step_dir(s) for s in steps) == [layout.step_dir(s) for s in sorted(steps)]


@pytest.mark.parametrize("step", [-1, -100, 10**12, 10**15])
def test_step_dir_rejects_steps_out_of_range(step: int) -> None:
    with pytest.raises(ValueError):
        layout.step_dir(step)


def test_parse_step_reads_the_step_of_any_blob_in_a_step_folder() -> None:
    assert layout.parse_step("job/checkpoints/000000000042/w1/__0_0.distcp", "job") == 42
    assert layout.parse_step("job/checkpoints/000000000042/manifest.json", "job") == 42
    assert layout.parse_step("a/b/checkpoints/000000000007/x", "a/b") == 7
    assert layout.parse_step("checkpoints/000000000003/x", "") == 3


@pytest.mark.parametrize(
    "blob",
    [
        "job/events.jsonl",  # not under checkpoints/
        "other/checkpoints/000000000001/x",  # another job
        "jobx/checkpoints/000000000001/x",  # a job whose name starts like ours
        "job/checkpoints/1/x",  # not 12 digits
        "job/checkpoints/0000000000001/x",  # 13 digits
        "job/checkpoints/00000000000a/x",  # not digits
        "job/checkpoints/-00000000001/x",
        "job/checkpoints/+00000000001/x",
        "job/checkpoints/000000000001\n/x",  # a trailing newline is not a digit
        "job/checkpoints/\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660\u0661\u0662/x",  # Arabic-Indic digits
        "job/checkpoints/",
    ],
)
def test_parse_step_ignores_blobs_outside_step_folders(blob: str) -> None:
    assert layout.parse_step(blob, "job") is None


def test_parse_step_inverts_step_dir() -> None:
    for step in (0, 1, 17, 10**12 - 1):
        name = layout.manifest_name("job", step)
        assert layout.parse_step(name, "job") == step


# --------------------------------------------------------------------------- paths


def test_join_skips_empty_parts_and_surplus_slashes() -> None:
    assert layout.join("", "checkpoints") == "checkpoints"
    assert layout.join("job", "", "checkpoints") == "job/checkpoints"
    assert layout.join("/job/", "/checkpoints/", "x") == "job/checkpoints/x"
    assert layout.join("", "") == ""
    assert layout.join("/", "a") == "a"


def test_paths_under_an_empty_job_prefix_have_no_leading_slash() -> None:
    assert layout.checkpoints_prefix("") == "checkpoints/"
    assert layout.checkpoint_prefix("", 5) == "checkpoints/000000000005/"
    assert layout.manifest_name("", 5) == "checkpoints/000000000005/manifest.json"
    assert layout.writer_prefix("", 5, "abc") == "checkpoints/000000000005/abc/"
    assert layout.events_name("") == "events.jsonl"


def test_paths_under_a_job_prefix() -> None:
    assert layout.checkpoints_prefix("team/job-1") == "team/job-1/checkpoints/"
    assert layout.checkpoint_prefix("job/", 5) == "job/checkpoints/000000000005/"
    assert layout.manifest_name("job", 5) == "job/checkpoints/000000000005/manifest.json"
    assert layout.writer_prefix("job", 5, "w") == "job/checkpoints/000000000005/w/"
    assert layout.events_name("job") == "job/events.jsonl"
    # the manifest and every writer folder are inside the step's folder
    assert layout.manifest_name("job", 5).startswith(layout.checkpoint_prefix("job", 5))
    assert layout.writer_prefix("job", 5, "w").startswith(layout.checkpoint_prefix("job", 5))


# --------------------------------------------------------------------------- job names


@pytest.mark.parametrize("name", ["a", "0", "job", "job-1", "a1-b2-c3", "9lives", "x" * 63, "a" + "-" * 61 + "b"])
def test_valid_dns_labels_are_accepted_as_job_names(name: str) -> None:
    assert layout.validate_job_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-job",
        "job-",
        "-",
        "Job",
        "JOB",
        "job_1",
        "job.1",
        "job/1",
        "job 1",
        "x" * 64,
        "jöb",
        "job\n",  # a trailing newline is not part of a DNS label
        "\njob",
        "job\x00",
    ],
)
def test_invalid_dns_labels_are_rejected_as_job_names(name: str) -> None:
    with pytest.raises(ValueError):
        layout.validate_job_name(name)


def test_none_is_rejected_as_a_job_name() -> None:
    with pytest.raises(ValueError):
        layout.validate_job_name(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- manifest


def _manifest(**changes) -> Manifest:
    fields = dict(
        step=42,
        created=1_700_000_000.25,
        world_size=4,
        writer="a1b2c3d4e5f6",
        files=layout.manifest_files(
            [
                FileEntry("a1b2c3d4e5f6/__1_0.distcp", 2048, "bbbbbbbbbbbbbbbbbbbbbb=="),
                FileEntry("a1b2c3d4e5f6/.metadata", 300, "mmmmmmmmmmmmmmmmmmmmmm=="),
                FileEntry("a1b2c3d4e5f6/__0_0.distcp", 1024, "aaaaaaaaaaaaaaaaaaaaaa=="),
            ]
        ),
        extra={"note": "hi", "nested": {"k": [1, 2]}},
    )
    fields.update(changes)
    return Manifest(**fields)


def _doc(**changes) -> dict:
    doc = json.loads(_manifest().to_bytes())
    doc.update(changes)
    return doc


def _raw(doc) -> bytes:
    return json.dumps(doc).encode()


def test_manifest_round_trips_through_json() -> None:
    m = _manifest()
    back = Manifest.from_bytes(m.to_bytes())
    assert back == m
    assert back.files == m.files
    assert back.extra == {"note": "hi", "nested": {"k": [1, 2]}}
    assert back.total_bytes == 2048 + 300 + 1024


def test_manifest_json_names_its_format_and_total_size() -> None:
    doc = json.loads(_manifest().to_bytes())
    assert doc["format"] == layout.FORMAT_NAME
    assert doc["format_version"] == layout.FORMAT_VERSION
    assert doc["total_bytes"] == 2048 + 300 + 1024
    assert [f["path"] for f in doc["files"]] == sorted(f["path"] for f in doc["files"])


def test_manifest_bytes_are_stable_for_equal_manifests() -> None:
    files = list(_manifest().files)
    a = _manifest(files=layout.manifest_files(files))
    b = _manifest(files=layout.manifest_files(reversed(files)))
    assert a.to_bytes() == b.to_bytes()


def test_manifest_without_extra_reads_back_with_empty_extra() -> None:
    doc = _doc()
    del doc["extra"]
    assert Manifest.from_bytes(_raw(doc)).extra == {}


def test_manifest_of_an_older_format_version_is_accepted() -> None:
    if layout.FORMAT_VERSION < 1:
        pytest.skip("no older version")
    assert Manifest.from_bytes(_raw(_doc(format_version=layout.FORMAT_VERSION))).format_version == layout.FORMAT_VERSION


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"\xff\xfe\x00garbage",
        b"{",
        b"[]",
        b"[1, 2]",
        b"null",
        b"42",
        b'"manifest"',
        b"{}",
    ],
)
def test_manifest_from_garbage_is_rejected(data: bytes) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(data)


@pytest.mark.parametrize("key", ["files", "step", "created", "world_size", "writer", "format", "format_version"])
def test_manifest_missing_a_required_key_is_rejected(key: str) -> None:
    doc = _doc()
    del doc[key]
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(doc))


@pytest.mark.parametrize("key", ["path", "size", "sha256"])
def test_manifest_file_entry_missing_a_key_is_rejected(key: str) -> None:
    doc = _doc()
    del doc["files"][0][key]
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(doc))


@pytest.mark.parametrize(
    "changes",
    [
        {"step": "forty-two"},
        {"created": "yesterday"},
        {"world_size": None},
        {"files": "a/b"},
        {"files": {"a": 1}},
        {"files": [["a", 1, "x"]]},
        {"files": [{"path": "w/a", "size": "big", "sha256": "x"}]},
    ],
)
def test_manifest_with_wrongly_typed_fields_is_rejected(changes: dict) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(_doc(**changes)))


@pytest.mark.parametrize("fmt", ["torch-dcp-v2", "safetensors", "", "TORCH-DCP"])
def test_manifest_of_an_unknown_format_is_rejected(fmt: str) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(_doc(format=fmt)))


@pytest.mark.parametrize("delta", [1, 2, 100])
def test_manifest_of_a_newer_format_version_is_rejected(delta: int) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(_doc(format_version=layout.FORMAT_VERSION + delta)))


def test_manifest_listing_no_files_is_rejected() -> None:
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(_doc(files=[])))


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/w/a", "..", "../other-step/w/a", "w/../../x", "w/..", "w/a/../../../x"],
)
def test_manifest_with_a_path_outside_its_checkpoint_is_rejected(path: str) -> None:
    doc = _doc()
    doc["files"].append({"path": path, "size": 1, "sha256": "x"})
    with pytest.raises(ManifestError):
        Manifest.from_bytes(_raw(doc))


def test_manifest_error_is_a_value_error() -> None:
    assert issubclass(ManifestError, ValueError)


def test_manifest_files_are_sorted_by_path() -> None:
    entries = [FileEntry("w/b", 1, "x"), FileEntry("w/a", 2, "y"), FileEntry("w/.metadata", 3, "z")]
    assert [f.path for f in layout.manifest_files(entries)] == ["w/.metadata", "w/a", "w/b"]
