"""Bad job configs and paths, run in-process through `main(argv)` as tests/test_bad_input_cli.py runs
its table: exit 2, exactly one `longrope: error:` line naming the field and the value, nothing on stdout, nothing
written under the test's folder. Then the good paths beside those checks: `--set` mapping merge, `validate`'s
verdict, `--help` entries and configs/README.md's field table.

The demo config (`configs/demo.yaml`) scores the shipped reference model: a byte-level Llama with 4 layers,
4 heads of head_dim 32 (16 rotary pairs) and original length 128, read at 1024.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import cli_error_line, longrope_block, write_factors_file

from longrope.search.cli.main import build_parser, main
from longrope.search.config.strict import JobConfigError
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.reference_recipe import reference_model_dir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEMO = str(CONFIGS / "demo.yaml")
# a search that costs seconds if it ever gets past its checks (the settings of tests/test_search_cli.py)
CHEAP = [
    "data.search_windows=2",
    "search.seeds=[pi, ntk, yarn]",  # the paper's three, not the tuned grids: the counts are worked for them
    "search.population=4",
    "search.generations=0",
    "search.parents=2",
    "search.mutations=1",
    "search.crossovers=1",
    "workers.num_workers=1",
]
LONG_NAME = "a" * 300  # past NAME_MAX (255 bytes on Linux and macOS)


# ---- helpers ----


def set_args(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


def validate(t: Path, *overrides: str) -> list[str]:
    """`longrope validate configs/demo.yaml`, writing (if it ever did) under t/out."""
    return ["validate", DEMO, *set_args(f"output_dir={t / 'out'}", *overrides)]


def search(t: Path, *overrides: str) -> list[str]:
    """A cheap `longrope search` of the demo config into t/out."""
    return ["search", "--no-progress", DEMO, *set_args(f"output_dir={t / 'out'}", *CHEAP, *overrides)]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def factors_file(t: Path) -> Path:
    """A factors file for the reference model (16 pairs, original length 128, target 1024)."""
    block = longrope_block([1.0 + i / 4 for i in range(16)], original=128, factor=8.0, attention_factor=1.2)
    return write_factors_file(t / "factors.json", block, max_position_embeddings=1024)


# ---- the table: id -> (argv builder, a substring of the one error line, or a tuple of them) ----

CASES = [
    # model.config_overrides go through the model's config class, its meta-device build and size checks
    pytest.param(
        lambda t: validate(t, "model.config_overrides={num_hidden_layers: -1}"),
        "model.config_overrides.num_hidden_layers = -1: must be at least 1",
        id="overrides-negative-layers",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={num_hidden_layers: 0}"),
        "model.config_overrides.num_hidden_layers = 0: must be at least 1",
        id="overrides-zero-layers",
    ),
    pytest.param(
        lambda t: search(t, "model.config_overrides={head_dim: 7}"),
        "model.config_overrides.head_dim = 7:",
        id="overrides-odd-head-dim-search",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={head_dim: 0}"),
        "model.config_overrides.head_dim = 0: must be at least 1",
        id="overrides-zero-head-dim",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={num_key_value_heads: 3}"),
        "model.config_overrides.num_key_value_heads = 3: must divide num_attention_heads (4)",
        id="overrides-kv-heads-not-dividing",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={hidden_size: 130}"),
        "model.config_overrides.hidden_size = 130: LlamaConfig refuses it",
        id="overrides-config-class-validation",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={num_hidden_layers: two}"),
        "model.config_overrides.num_hidden_layers = 'two': LlamaConfig refuses it",
        id="overrides-wrong-type",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={vocab_size: 0}"),
        "model.config_overrides.vocab_size = 0: must be at least 1",
        id="overrides-zero-vocab",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={head_dim: 16}"),
        "model.config_overrides.head_dim = 16: the model it builds has model.layers.0.self_attn.q_proj.weight of "
        "shape [64, 128], the checkpoint's is [128, 128]",
        id="overrides-size-the-weights-fix",
    ),
    pytest.param(
        lambda t: validate(t, "model.config_overrides={sliding_windw: null}"),
        "model.config_overrides.sliding_windw = None: LlamaConfig has no such attribute",
        id="overrides-unknown-key",
    ),
    # a population needs at least one seed
    pytest.param(
        lambda t: validate(t, "search.seeds=[]"),
        "search.seeds: a population needs at least one seed",
        id="seeds-empty-validate",
    ),
    pytest.param(
        lambda t: search(t, "search.seeds=[]"),
        "search.seeds: a population needs at least one seed",
        id="seeds-empty-search",
    ),
    # a control character in a `--set` value or a config file
    pytest.param(
        lambda t: validate(t, "name=a\x01b"),
        "--set name: cannot read value 'a\\x01b' (not valid YAML: control character U+0001 at offset 1",
        id="set-control-character",
    ),
    pytest.param(
        lambda t: ["validate", str(write(t / "c.yaml", "target_length: 1024\nname: a\x1bb\n"))],
        "c.yaml: not valid YAML: control character U+001B at offset 27",
        id="yaml-control-character",
    ),
    # the device string
    pytest.param(
        lambda t: validate(t, "model.device=tpu9"),
        "model.device = 'tpu9': not a device torch knows",
        id="model-device-unknown",
    ),
    pytest.param(
        lambda t: [*validate(t, "model.device=cuda:x"), "--offline"],
        "model.device = 'cuda:x': not a device torch knows",
        id="model-device-bad-index-offline",
    ),
    pytest.param(
        lambda t: ["verify", str(factors_file(t)), "--model", str(reference_model_dir()), "--device", "tpu9"],
        "--device 'tpu9': not a device torch knows",
        id="verify-device-unknown",
    ),
    # paths longer than the operating system takes
    pytest.param(
        lambda t: validate(t, f"output_dir={t / LONG_NAME}"),
        ("output_dir = ", "characters): a path component of 300 bytes (at most 255)"),
        id="output-dir-long-component",
    ),
    pytest.param(
        lambda t: validate(t, f"output_dir={t}/{'ab/' * 1700}"),
        "bytes (at most",
        id="output-dir-5000-characters",
    ),
    pytest.param(
        lambda t: search(t, f"output_dir={t / LONG_NAME}"),
        ("output_dir = ", "characters): a path component of 300 bytes (at most 255)"),
        id="output-dir-long-component-search",
    ),
    pytest.param(
        lambda t: validate(t, f"data.cache_dir={t / LONG_NAME}"),
        ("data.cache_dir = ", "characters): a path component of 300 bytes (at most 255)"),
        id="cache-dir-long-component",
    ),
    pytest.param(
        lambda t: validate(t, f"data.search_source={t / LONG_NAME}"),
        ("data.search_source = ", "characters): a path component of 300 bytes (at most 255)"),
        id="search-source-long-component",
    ),
    pytest.param(
        lambda t: validate(t, f"model.path={t / LONG_NAME}"),
        ("model.path = ", "characters): a path component of 300 bytes (at most 255)"),
        id="model-path-long-component",
    ),
    pytest.param(
        lambda t: validate(t, f"search.seed_files=[{t / LONG_NAME}]"),
        ("search.seed_files.0 = ", "characters): a path component of 300 bytes (at most 255)"),
        id="seed-file-long-component",
    ),
    pytest.param(
        lambda t: ["validate", str(t / (LONG_NAME + ".yaml"))],
        "cannot read (File name too long)",
        id="config-file-long-name",
    ),
    pytest.param(
        lambda t: ["status", str(t / LONG_NAME)],
        "characters): path too long for this system",
        id="status-long-run-dir",
    ),
    pytest.param(
        lambda t: ["export", str(t / LONG_NAME), "-o", str(t / "f.json")],
        "characters): path too long for this system",
        id="export-long-run-dir",
    ),
    pytest.param(
        lambda t: ["search", "--resume", str(t / LONG_NAME)],
        "characters): path too long for this system",
        id="resume-long-run-dir",
    ),
    # the error names what the user gave
    pytest.param(
        lambda t: search(t, "output_dir=/proc/longrope"),
        "output_dir: cannot write the windows cache",
        id="output-dir-unwritable-names-output-dir",
    ),
    pytest.param(lambda t: ["validate", "/dev/null"], "/dev/null: not a regular file", id="config-is-a-device"),
    # search checks the test source up front, as validate does
    pytest.param(
        lambda t: search(t, f"data.test_source={t / 'no-such-test-data'}"),
        "data.test_source: ",
        id="search-test-source-missing",
    ),
    # the workers' failure handling: refused before any worker starts
    pytest.param(
        lambda t: search(t, "workers.retries=-1"),
        "workers.retries = -1: Input should be greater than or equal to 0",
        id="workers-retries-negative",
    ),
    pytest.param(
        lambda t: validate(t, "workers.restart_timeout_s=0"),
        "workers.restart_timeout_s = 0: Input should be greater than 0",
        id="workers-restart-timeout-zero",
    ),
    pytest.param(
        lambda t: search(t, "workers.accelerator_type='H 100'"),
        "workers.accelerator_type = 'H 100': must be a Ray accelerator type such as H100",
        id="workers-accelerator-type-not-a-name",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), CASES)
def test_bad_config_is_one_line_and_writes_nothing(make_args, expected, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative default (runs/job) would land here, and be seen
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    for part in expected if isinstance(expected, tuple) else (expected,):
        assert part in line


def test_output_dir_unwritable_does_not_blame_the_cache_dir(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = cli_error_line(search(tmp_path, "output_dir=/proc/longrope"), capsys, caplog, folder=tmp_path)
    assert line.startswith("longrope: error: output_dir: ") and "'/proc/longrope/windows-cache/" in line


# ---- a mapping given to `--set` merges into its section ----


def test_set_section_mapping_merges_into_the_file_and_earlier_sets():
    config = load_job_config(DEMO, ["search.seed=7", "search={}", "search={population: 20, early_stop: {}}"])
    assert config.search.population == 20  # given now
    assert config.search.generations == 20 and config.search.parents == 16  # the file's, kept
    assert config.search.seed == 7  # an earlier --set, kept
    assert config.search.attention_factor.mode == "searched" and config.search.early_stop.patience == 6  # nested


def test_set_mapping_valued_field_is_replaced_whole():
    """`model.config_overrides` and `data.objective` are values that happen to be mappings, not sections."""
    config = load_job_config(DEMO, ["data.objective={perplexity: 1, tail: 1}", "data.objective={needle: 1}"])
    assert config.data.objective == {"needle": 1}


# ---- validate's verdict ----


def test_validate_prints_a_verdict_and_a_short_summary(capsys):
    assert main(["validate", DEMO, "--set", "search.generations=3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("validate: ok — ") and len(lines) <= 8, out
    for fact in ("reference", "128 -> 1024 tokens", "pi, ntk, yarn", "corpus:search", "corpus:test", "8 search"):
        assert fact in out, fact


def test_validate_json_prints_the_full_document(capsys):
    assert main(["validate", DEMO, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["original_length"] == 128 and document["config"]["search"]["population"] == 32
    assert {check["what"] for check in document["checks"]} >= {"config", "model.path", "data.test_source"}


# ---- --help and configs/README.md ----


def subcommand(name: str):
    parser = build_parser()
    action = next(a for a in parser._subparsers._group_actions if a.dest == "command")
    return action.choices[name]


@pytest.mark.parametrize(("command", "dest"), [("status", "run_dir"), ("status", "json"), ("export", "run_dir")])
def test_help_describes_every_argument(command, dest):
    action = next(a for a in subcommand(command)._actions if a.dest == dest)
    assert action.help and action.help.strip()


def test_configs_readme_field_table_is_the_generated_one():
    from longrope.search.config.docs import FIELDS_BEGIN, FIELDS_END, fields_table

    readme = (CONFIGS / "README.md").read_text()
    assert FIELDS_BEGIN in readme and FIELDS_END in readme
    generated = readme.split(FIELDS_BEGIN, 1)[1].split(FIELDS_END, 1)[0].strip()
    assert generated == fields_table().strip(), "run: python -m longrope.search.config.docs --write configs/README.md"


def test_every_config_field_has_a_description():
    from longrope.search.config.docs import config_fields

    fields = config_fields()
    assert {"target_length", "search.seeds", "model.config_overrides", "search.racing.z"} <= {f.name for f in fields}
    assert all(field.description for field in fields), [field.name for field in fields if not field.description]


# ---- the torch-free device check says what torch.device says ----


@pytest.mark.parametrize(
    "device", ["auto", "cpu", "cuda", "cuda:0", "cuda:127", "mps", "xpu:3", "tpu9", "tpu", "gpu", "CUDA", "cuda:x",
               "cuda:01", "cuda:-1", "cuda: 0", "cuda:1:2", "", " cuda", "cuda:128"],
)  # fmt: skip
def test_device_check_agrees_with_torch(device):
    """Every string the check accepts, torch parses to itself; every one it refuses, torch refuses or misreads
    (cuda:128 wraps to cuda:-128: c10::DeviceIndex is int8_t)."""
    import torch

    from longrope.workers.devices import device_problem

    if device == "auto":
        assert device_problem(device) is None
        return
    try:
        parsed = str(torch.device(device))
    except RuntimeError:
        parsed = None
    assert (device_problem(device) is None) == (parsed == device), (device, parsed)


# ---- booleans where numbers go ----


def numeric_fields(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted field, value) for every number and list of numbers in a config dump: the fields a boolean must not
    stand in for (found from the values, not from the types the check reads)."""
    found = []
    for name, value in node.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict):
            found += numeric_fields(value, f"{path}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found.append((path, value))
        elif isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
            found.append((path, list(value)))
    return found


def test_a_boolean_is_refused_wherever_a_number_goes():
    """YAML's true/false would read as 1/0 (`search.gradient.steps=true` one step, `learning_rate=true` 1.0,
    `polish_every=false` "must be >= 1"), so every numeric field of the demo config (and of the sections it leaves
    at their defaults) refuses both, naming the field and what goes there; a list of numbers refuses a boolean among
    them."""
    config = load_job_config(DEMO).model_dump(mode="json")
    fields = numeric_fields(config)
    names = {name for name, _ in fields}
    assert {"search.generations", "search.gradient.steps", "search.gradient.learning_rate", "search.seed"} <= names
    for name, value in fields:
        for flag in ("true", "false"):
            given = f"[{value[0]}, {flag}]" if isinstance(value, list) else flag
            with pytest.raises(JobConfigError) as caught:
                load_job_config(DEMO, [f"{name}={given}"])
            message = str(caught.value)
            assert f"{name} = " in message and "boolean" in message and "\n" not in message, (name, message)


def test_booleans_still_set_the_switches():
    """The check leaves boolean fields alone: a switch takes true and false."""
    config = load_job_config(DEMO, ["search.racing.enabled=true", "search.n_hat.enabled=false"])
    assert config.search.racing.enabled is True and config.search.n_hat.enabled is False


def test_a_boolean_number_on_the_command_line_is_one_line(tmp_path, capsys, caplog):
    line = cli_error_line(validate(tmp_path, "search.gradient.polish_every=false"), capsys, caplog, folder=tmp_path)
    assert "search.gradient.polish_every = False: a boolean (false) where an integer goes" in line
