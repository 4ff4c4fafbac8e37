"""A change to a file a run directory holds comes with a fixture of the previous format.

The files' shapes (every field, type, constraint and default of their pydantic models, `run_file_shapes`) are
checked against the snapshot tests/fixtures/old_runs/shapes.json, which can only be rewritten once a fixture run
directory was added: so a field added to the config or to state.json, however harmless it looks, first gets a
run directory of the code before it, which tests/test_old_run_dirs.py then reads, exports and resumes."""

from __future__ import annotations

import json

import pytest
import run_file_shapes
from pydantic import ConfigDict, Field, create_model, field_validator

from longrope.search.run.job_record import JobRecord


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


def test_the_run_files_have_the_snapshots_shape():
    change = first_difference(run_file_shapes.read_snapshot()["shapes"], run_file_shapes.current_shapes())
    assert change is None, (
        f"a run directory's file changed shape ({change.lstrip('.')}): add a fixture run directory written by the "
        "code before this change (tests/fixtures/old_runs/README.md), then `python tests/run_file_shapes.py --write`"
    )


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


@pytest.fixture
def snapshot_copy(tmp_path, monkeypatch):
    path = tmp_path / "shapes.json"
    path.write_text(run_file_shapes.SNAPSHOT.read_text())
    monkeypatch.setattr(run_file_shapes, "SNAPSHOT", path)
    return path


def test_the_snapshot_is_not_rewritten_for_a_new_shape_without_a_new_fixture(snapshot_copy):
    snapshot = json.loads(snapshot_copy.read_text())
    del snapshot["shapes"]["models"]["RunState"]["fields"]["finished"]  # the code "before" had no such field
    snapshot_copy.write_text(json.dumps(snapshot))
    before = snapshot_copy.read_bytes()
    assert run_file_shapes.write_snapshot().startswith("refused: the run directory's files changed shape")
    assert snapshot_copy.read_bytes() == before


def test_the_snapshot_is_rewritten_once_a_fixture_was_added(snapshot_copy):
    snapshot = json.loads(snapshot_copy.read_text())
    del snapshot["shapes"]["models"]["RunState"]["fields"]["finished"]
    snapshot["fixtures"] = snapshot["fixtures"][:-1]  # the newest fixture came after the snapshot
    snapshot_copy.write_text(json.dumps(snapshot))
    assert run_file_shapes.write_snapshot() == f"wrote {snapshot_copy}"
    rewritten = json.loads(snapshot_copy.read_text())
    assert rewritten == {"shapes": run_file_shapes.current_shapes(), "fixtures": run_file_shapes.fixture_names()}
