"""Bad input to the `longrope` CLI, run in-process through `main(argv)`: exit code 2, exactly one line on stderr
("longrope: error: ..." naming the field or value), nothing on stdout, and nothing written under the test's
folder. Configs and values here; factors files, run and model directories in test_bad_input_cli_files.py.
Complements the subprocess cases in test_search_cli.py (none of those is repeated here).

The reference model (`model.path: reference`) has original length 128 and 16 rotary pairs; the cheap run
directory (bench/known_problem.py) has head_dim 32, original length 64 and target length 256.
"""

from __future__ import annotations

import json

import pytest
from bad_input_helpers import (
    alias_bomb,
    base,
    random_bytes,
    search,
    validate,
    write,
)
from cli_checks import cli_error_line
from search_helpers import known_problem_run

# ---- the table: id -> (argv builder, a substring of the one error line) ----

CASES = [
    # 1. YAML config files
    pytest.param(lambda t: validate(t, random_bytes()), "c.yaml: not UTF-8 text (byte", id="yaml-binary-random"),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\nname: a\x00b\n"),
        "c.yaml: holds a NUL character at offset 27",
        id="yaml-nul-in-utf8-text",
    ),
    pytest.param(
        lambda t: validate(t, b"target_length: 1024\nname: caf\xe9\n"),
        "c.yaml: not UTF-8 text (byte 29)",
        id="yaml-non-utf8",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\na: &x [*x]\n"),
        "line 2: an alias refers to a node that contains it",
        id="yaml-recursive-alias",
    ),
    pytest.param(
        lambda t: validate(t, alias_bomb()),
        "holds more than 100000 values once aliases are expanded",
        id="yaml-billion-laughs",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\nname: x\ntarget_length: 2048\n"),
        "key 'target_length' given twice (lines 1 and 3)",
        id="yaml-duplicate-key",
    ),
    pytest.param(
        lambda t: validate(t, "- target_length: 1024\n"),
        "expected a mapping of fields at the top level, got list",
        id="yaml-top-level-list",
    ),
    pytest.param(
        lambda t: validate(t, "1024\n"),
        "expected a mapping of fields at the top level, got int",
        id="yaml-top-level-scalar",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\n# " + "x" * (1 << 20) + "\n"),
        "bytes; a config is at most 1048576 bytes",
        id="yaml-over-1mib",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: " + "[" * 5000 + "]" * 5000 + "\n"),
        "c.yaml: nested too deeply",
        id="yaml-deeply-nested",
    ),
    pytest.param(lambda t: ["validate", str(t)], "is a directory, not a config file", id="yaml-path-is-a-directory"),
    pytest.param(lambda t: validate(t, base(t), "=3"), "--set '=3': expected FIELD=VALUE", id="set-empty-key"),
    pytest.param(
        lambda t: validate(t, base(t), "target_length.x=1"),
        "--set target_length.x: target_length is not a section",
        id="set-into-non-section",
    ),
    # 2. values `validate` refuses
    pytest.param(
        lambda t: validate(t, base(t, search={"seed": -1})),
        "search.seed = -1: Input should be greater than or equal to 0",
        id="search-seed-negative",
    ),
    pytest.param(
        lambda t: validate(t, base(t, data={"seed": -1})),
        "data.seed = -1: Input should be greater than or equal to 0",
        id="data-seed-negative",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"grid_step": 1e-30})),
        "search.grid_step = 1e-30: Input should be greater than or equal to 0.0001",
        id="grid-step-tiny",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"max_factor": 1e300})),
        "search.max_factor = 1e+300: Input should be less than or equal to 10000",
        id="max-factor-huge",
    ),
    pytest.param(
        lambda t: validate(t, f"target_length: {10**30}\noutput_dir: {t / 'out'}\n"),
        f"target_length = {10**30}: Input should be less than or equal to 67108864",
        id="target-length-1e30",
    ),
    pytest.param(
        lambda t: validate(t, f"target_length: 1024\noriginal_length: {10**30}\noutput_dir: {t / 'out'}\n"),
        f"original_length = {10**30}: Input should be less than or equal to 67108864",
        id="original-length-1e30",
    ),
    pytest.param(
        lambda t: validate(t, base(t, output_dir="")),
        "output_dir = '': String should have at least 1 character",
        id="output-dir-empty",
    ),
    pytest.param(
        lambda t: validate(t, base(t, output_dir="   ")),
        "output_dir = '   ': must name a directory",
        id="output-dir-blank",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"attention_factor": {"step": 1e-30}})),
        "search.attention_factor.step = 1e-30: Input should be greater than or equal to 0.0001",
        id="attention-factor-step-tiny",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"population": 10**12})),
        "search.population = 1000000000000: Input should be less than or equal to 1000000",
        id="population-huge",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"n_hat": {"enabled": True, "choices": [0, 4, 1024]}})),
        "search.n_hat.choices: every choice must be < target_length (1024), got 1024",
        id="n-hat-choice-at-target",
    ),
    pytest.param(
        lambda t: validate(t, base(t, workers={"num_workers": 0})),
        "workers.num_workers = 0: Input should be greater than or equal to 1",
        id="num-workers-zero",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"generations": "ten"})),
        "search.generations = 'ten': Input should be a valid integer",
        id="string-for-int",
    ),
    pytest.param(
        lambda t: validate(t, base(t, model={"trust_remote_code": "perhaps"})),
        "model.trust_remote_code = 'perhaps': Input should be a valid boolean",
        id="boolean-ish-string",
    ),
    pytest.param(
        lambda t: validate(t, base(t, target_length=None)),
        "target_length = None: Input should be a valid integer",
        id="target-length-null",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search.max_factor=.inf"),
        "search.max_factor = inf: must be a finite number",
        id="set-inf",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"change_probability": -0.1})),
        "search.change_probability = -0.1: Input should be greater than 0",
        id="change-probability-negative",
    ),
    # data sources: checked by `validate` as the model is, one line naming the field and the value
    pytest.param(
        lambda t: validate(t, base(t, data={"search_source": "none.jsonl"})),
        "data.search_source: 'none.jsonl' does not exist",
        id="validate-missing-search-source",
    ),
    pytest.param(
        lambda t: (t / "empty").mkdir() or validate(t, base(t, data={"test_source": "empty"})),
        "data.test_source: 'empty' holds no .txt/.md/.jsonl/.parquet documents",
        id="validate-data-folder-without-documents",
    ),
    pytest.param(
        lambda t: (
            write(t / "d.jsonl", '{"text": "a"}\n{oops\n') and validate(t, base(t, data={"search_source": "d.jsonl"}))
        ),
        "data.search_source: data file: d.jsonl:2 is not valid JSON",
        id="validate-data-file-not-jsonl",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "data.test_source=corpus:nope"),
        "data.test_source: unknown corpus split 'nope'",
        id="validate-unknown-corpus-split",
    ),
    pytest.param(
        lambda t: (
            write(
                t / "s.json",
                json.dumps(
                    {
                        "rope_parameters": {
                            "rope_type": "longrope",
                            "rope_theta": 10000.0,
                            "long_factor": [1.0, 3.0, 2.0],
                            "short_factor": [1.0] * 3,
                            "original_max_position_embeddings": 128,
                            "factor": 8.0,
                            "attention_factor": 1.1,
                        },
                        "max_position_embeddings": 1024,
                        "provenance": {"created_by": "test", "method": "x", "method_rope_parameters": {}},
                    }
                ),
            )
            and [
                *validate(t, base(t, model={"path": "/cluster/model"}, search={"seed_files": ["s.json"]})),
                "--offline",
            ]
        ),
        "search.seed_files: s.json: rope_parameters.long_factor: factors must be non-decreasing, got 3.0 then 2.0",
        id="validate-offline-still-reads-a-local-seed-file",
    ),
    # 6. found on review: --set goes through the same YAML guards; values Ray or JSON cannot take
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides=&a {x: *a}"),
        "--set model.config_overrides: cannot read value '&a {x: *a}' (line 1: an alias refers to a node",
        id="set-recursive-alias",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search={seed: 1, seed: 2}"),
        "key 'seed' given twice",
        id="set-duplicate-key",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: !!binary /w==}"),
        "x: a bytes value is not allowed (JSON values only)",
        id="set-binary-value",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: " + alias_bomb(5, 9).replace("\n", " ") + "}"),
        "--set model.config_overrides: cannot read value",
        id="set-alias-bomb",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: " + "9" * 5000 + "\n"),
        "c.yaml: unreadable value (Exceeds the limit (4300 digits)",
        id="yaml-integer-past-digit-limit",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides.d=2024-01-01"),
        "cannot read value '2024-01-01' (value: a date value is not allowed (JSON values only))",
        id="set-date-value",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: [1.0, .nan]}"),
        "model.config_overrides.x[1] = nan: must be a finite number",
        id="set-non-finite-in-a-list",
    ),
    pytest.param(
        lambda t: validate(t, base(t, workers={"num_cpus_per_worker": 0.00001})),
        "workers.num_cpus_per_worker = 1e-05: must be 0 or at least 0.0001",
        id="ray-resource-precision",
    ),
    pytest.param(
        lambda t: search(t, base(t, output_dir=str(write(t / "plain-file", "x") / "run"))),
        "plain-file' exists and is not a directory",
        id="output-dir-under-a-file",
    ),
    # search cost settings: racing, schedule, optimizer
    pytest.param(
        lambda t: search(t, base(t, search={"schedule": "fast"})),
        "search.schedule = 'fast': Input should be 'generational' or 'steady'",
        id="schedule-unknown",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "pso"})),
        "search.optimizer = 'pso': unknown optimizer; one of dim_mono, cmaes, gradient, hybrid",
        id="optimizer-unknown",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "z": -1}})),
        "search.racing.z = -1: Input should be greater than or equal to 0",
        id="racing-negative-z",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "min_windows": 1}})),
        "search.racing.min_windows = 1: Input should be greater than or equal to 2",
        id="racing-min-windows-one",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "min_windows": 8}})),
        "search.racing.min_windows: must be < data.search_windows (8) for racing to stop anything, got 8",
        id="racing-min-windows-all",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": "sometimes"}})),
        "search.racing.enabled = 'sometimes': Input should be a valid boolean",
        id="racing-enabled-not-bool",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"group_windows": 0}})),
        "search.racing.group_windows = 0: Input should be greater than or equal to 1",
        id="racing-group-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "schedule": "steady"})),
        "search.schedule: 'steady' needs optimizer 'dim_mono'",
        id="cmaes-steady",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "racing": {"enabled": True}})),
        "search.racing.enabled: racing needs optimizer 'dim_mono'",
        id="cmaes-racing",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "cmaes": {"sigma": 0}})),
        "search.cmaes.sigma = 0: Input should be greater than 0",
        id="cmaes-sigma-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"cmaes": {"population": 1}})),
        "search.cmaes.population = 1: Input should be greater than or equal to 2",
        id="cmaes-population-one",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search.racing.z=.nan"),
        "search.racing.z = nan: must be a finite number",
        id="racing-z-nan-override",
    ),
    # objectives, stages, short factors
    pytest.param(
        lambda t: search(t, base(t, data={"objective": {"perplexity": 0, "needle": 0}})),
        "data.objective: weights must sum to more than 0, got {",
        id="objective-weights-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, data={"objective": "needles"})),
        "data.objective: unknown objective 'needles' (expected one of perplexity, tail, needle)",
        id="objective-unknown",
    ),
    pytest.param(
        lambda t: search(t, {**base(t, data={"objective": "needle"}), "original_length": 16, "target_length": 64}),
        "data.objective: a needle needs 99 tokens for its preamble, key sentence, question and answer; windows of 65",
        id="needle-cannot-fit",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "critical_dim": 16})),
        "search.critical_dim: must be < 16 pairs, got 16",
        id="critical-dim-out-of-range",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 4})),
        "search.length_scale: must be >= target/original (8), got 4",
        id="length-scale-below-scale",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 8.05})),
        "search.length_scale: must be >= 8.1 for the 11 searched pairs",
        id="length-scale-empty-space",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [512, 256]})),
        "search.stages = [512, 256]: stage lengths must increase, got 512 then 256",
        id="stages-not-increasing",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [256, 1024]})),
        "search.stages: each stage length must lie between original_length",
        id="stage-at-target",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 6, "stages": [512]})),
        "search.stages: stage 2 at 1024 tokens: search.length_scale: must be >= target/original (8), got 6",
        id="stage-space-fails-only-at-the-last-stage",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [100]})),
        "search.stages: stage 1 at 100 tokens: target_length: must be greater than original_length (128), got 100",
        id="stage-below-original-length",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [256], "n_hat": {"enabled": True, "choices": [0, 512]}})),
        "search.stages: stage 1 at 256 tokens: search.n_hat.choices: every choice must be < target_length (256)",
        id="stage-shorter-than-n-hat",
    ),
    pytest.param(
        lambda t: search(
            t, base(t, data={"objective": "tail"}, search={"factor": "short", "long_factors": str(t / "f.json")})
        ),
        "data.objective: 'tail' counts positions past original_length",
        id="short-factor-with-tail",
    ),
    pytest.param(
        lambda t: search(
            t,
            base(
                t,
                search={"factor": "short", "long_factors": "f.json", "attention_factor": {"mode": "searched"}},
            ),
        ),
        "search.attention_factor.mode: a short-factor search keeps the long factors' attention factor",
        id="short-factor-with-searched-attention",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"factor": "short"})),
        "search.long_factors: factor 'short' needs the long factors it keeps",
        id="short-without-long-factors",
    ),
    pytest.param(
        lambda t: ["search", "--no-progress", "--resume", str(known_problem_run(t / "run")), "--set", "search.seed=5"],
        "--set 'search.seed=5': a resumed run can change only workers.*",
        id="resume-set-outside-workers",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), CASES)
def test_bad_input_is_one_line_and_writes_nothing(make_args, expected, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative default (runs/job) would land here, and be seen
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    assert expected in line
