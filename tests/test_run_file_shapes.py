"""A run file's shape changed since the last release comes with a new run-directory format that still reads the
release's.

The files' shapes (every field, type, constraint and default of their pydantic models, `run_file_shapes`) are
checked against the newest release's snapshot, tests/fixtures/releases/<version>/shapes.json: a change to any
model the release wrote, however harmless it looks, needs `run_store.FORMAT` moved on, with the release's format
still among `READABLE_FORMATS`, and tests/test_release_runs.py then reads, exports and resumes that release's
fixture run directories with today's code. A model the release did not have (a new optimizer's state) is no
change: no run directory of that release holds one."""

from __future__ import annotations

import json

import pytest
import run_file_shapes
from pydantic import ConfigDict, Field, create_model, field_validator

from longrope.search.run.job_record import JobRecord
from longrope.search.run.run_store import FORMAT, READABLE_FORMATS


def first_difference(old: object, new: object, where: str = "") -> str | None:
    """Where two JSON values first differ (`models.RunState.fields.finished.default`), None when equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                return f"{where}.{key}: {'added' if key not in old else 'removed'}"
            if found := first_difference(old[key], new[key], f"{where}.{key}"):
                return found
        return None
    return None if old == new else f"{where}: {old!r} -> {new!r}"


def release_change(release: dict, today: dict) -> str | None:
    """The first change to what a release's run directories hold: a model it wrote, the file a model is written to,
    a searcher kind's state model, or what the `Any` fields hold. Models and kinds added since are no change."""
    old, new = release["models"], today["models"]
    for name in old:
        if found := first_difference(old[name], new.get(name, {}), f".models.{name}"):
            return found
    if found := first_difference(release["files"], today["files"], ".files"):
        return found
    payloads, seeds = dict(today["payloads"]), today["payloads"]["seed_names"]
    payloads["seed_names"] = [name for name in release["payloads"]["seed_names"] if name in seeds]  # more: no change
    if found := first_difference(release["payloads"], payloads, ".payloads"):
        return found
    kinds = {kind: today["searcher_states"].get(kind) for kind in release["searcher_states"]}
    return first_difference(release["searcher_states"], kinds, ".searcher_states")


def test_a_shape_changed_since_the_last_release_moves_the_format_on():
    version = run_file_shapes.releases()[-1]
    release = run_file_shapes.read_snapshot(version)
    change = release_change(release, run_file_shapes.current_shapes())
    if change is None:
        assert release["format"] == FORMAT, f"the shapes are release {version}'s: so is its format"
        return
    assert release["format"] != FORMAT and release["format"] in READABLE_FORMATS, (
        f"a run directory's file changed shape since release {version} ({change.lstrip('.')}): move "
        f"run_store.FORMAT on from {release['format']!r} and keep reading {release['format']!r} (READABLE_FORMATS); "
        f"tests/test_release_runs.py holds the reader to release {version}'s fixtures"
    )


def test_a_model_or_optimizer_added_since_the_release_is_no_change():
    release = run_file_shapes.read_snapshot(run_file_shapes.releases()[-1])
    today = json.loads(json.dumps(release))
    today["models"]["RandomState"] = {"config": {}, "fields": {"seen": {"type": "int"}}, "validators": {}}
    today["searcher_states"]["random"] = "RandomState"
    assert release_change(release, today) is None
    today["payloads"]["seed_names"] = [*release["payloads"]["seed_names"], "a_new_closed_form"]
    assert release_change(release, today) is None, "a seed name more reads every older config"
    today["payloads"]["seed_names"] = release["payloads"]["seed_names"][1:]
    removed = f".payloads.seed_names: {release['payloads']['seed_names']} -> {release['payloads']['seed_names'][1:]}"
    assert release_change(release, today) == removed, "a seed name less leaves an older config unreadable"
    today["payloads"]["seed_names"] = release["payloads"]["seed_names"]
    del today["models"]["JobRecord"]["fields"]["model_dir"]
    assert release_change(release, today) == ".models.JobRecord.fields.model_dir: removed"


def test_a_field_added_with_a_default_changes_the_shape():
    """The case that once broke every older run's export: a later field with a default (not a required one)."""
    later = create_model("JobRecord", __base__=JobRecord, later_field=(int, Field(default=3, ge=0)))
    before = run_file_shapes.model_shapes({"job.json": JobRecord})
    after = run_file_shapes.model_shapes({"job.json": later})
    assert first_difference(before, after) == ".JobRecord.fields.later_field: added"
    assert after["JobRecord"]["fields"]["later_field"] == {"type": "int", "constraints": ["Ge(ge=0)"], "default": "3"}


class Stricter(JobRecord):
    model_config = ConfigDict(**JobRecord.model_config, strict=True)  # would refuse what older code wrote loosely


class Renamed(JobRecord):
    model_dir: str = Field(alias="model_path")  # the key on disk changes


class Tightened(JobRecord):
    @field_validator("model_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:  # older runs may hold a relative path
        if not value.startswith("/"):
            raise ValueError("model_dir must be absolute")
        return value


@pytest.mark.parametrize(("variant", "part"), [(Stricter, "config"), (Renamed, "fields"), (Tightened, "validators")])
def test_a_rule_of_how_a_file_reads_changes_the_shape(variant, part):
    before, after = run_file_shapes.ShapeWalk().shape(JobRecord), run_file_shapes.ShapeWalk().shape(variant)
    assert before[part] != after[part]
    assert {key: value for key, value in before.items() if key != part} == {
        key: value for key, value in after.items() if key != part
    }


def test_two_models_of_one_name_are_both_walked():
    first = create_model("Inner", x=(int, 0))
    second = create_model("Inner", y=(str, "a"))
    shapes = run_file_shapes.model_shapes({"a.json": create_model("A", inner=(first, ...)), "b.json": second})
    inner = {name: shape["fields"] for name, shape in shapes.items() if name.endswith("Inner")}
    assert sorted(map(list, inner.values())) == [["x"], ["y"]]
