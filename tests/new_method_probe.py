"""Run by tests/test_new_rope_method.py, in a fresh interpreter whose `longrope` is a copy of the package with one
more RoPE method (`long_waves`, its module and its registry entry): what each part that lists the closed forms makes
of it, printed as one JSON object for the test to check against values worked by hand. A job is the demo config
(the reference model, trained at 128 tokens) read at 512, seeded by the new method."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

import numpy as np

TARGET = 512
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def factors_of(method) -> list[float]:
    return method.factors(TARGET).double().tolist()


def registry() -> dict:
    """The factory, from a model config whose original length sits at the top level (as Phi-3 keeps it)."""
    import longrope.encodings
    from longrope.encodings import ROPE_METHODS, from_hf, from_hf_config

    config = {
        "hidden_size": 32,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
        "rope_parameters": {"rope_type": "long_waves", "factor": 4.0, "rope_theta": 10000.0},
    }
    method = from_hf_config(config)
    return {
        "package": longrope.encodings.__file__,
        "class": type(method).__name__,
        "inv_freq": method.inv_freq().tolist(),
        "round_trip": from_hf(method.to_hf(), head_dim=8, max_position_embeddings=64) == method,
        "registered": "long_waves" in ROPE_METHODS,
    }


def seeds() -> dict:
    """A config naming the new seed validates, a typo is one line naming the allowed seeds, and the search's first
    generation holds the new method's factors."""
    from longrope.search.config.strict import JobConfigError
    from longrope.search.job.job_context import JobContext
    from longrope.search.optimizers.factory import load_job_config, make_searcher

    config = load_job_config(CONFIGS / "demo.yaml", [f"target_length={TARGET}", "search.seeds=[long_waves, pi]"])
    try:
        load_job_config(CONFIGS / "demo.yaml", ["search.seeds=[long_wave]"])
        refused = None
    except JobConfigError as exc:
        refused = str(exc)
    context = JobContext.resolve(config)
    searcher = make_searcher(config.search, pairs=context.pairs, scale=context.scale, seeds=context.seeds())
    asked = [c for c in searcher.ask(config.search.population) if c.seed == "long_waves"]
    return {
        "config_seeds": list(config.search.seeds),
        "refused": refused,
        "seed": next(s.factors.tolist() for s in context.seeds() if s.name == "long_waves"),
        "asked": [c.factors.tolist() for c in asked],
    }


def compare_rows(context) -> dict:
    """compare's baseline rows, the tuning grid, and the best baseline as `summarize` picks it from per-window NLLs
    in which the new method is the best baseline and a given factors row is better still."""
    from longrope.search.config.strict import JobConfigError
    from longrope.search.reports.compare import summarize
    from longrope.search.reports.compare_result import BASELINES, is_given
    from longrope.search.reports.compare_rows import factors_rows
    from longrope.search.reports.tuned_baselines import pick_tuned, setting_label, tuning_grids

    baselines = context.baselines()
    grids = tuning_grids(context, "coarse")
    grid = grids["long_waves_tuned"]
    mean_nll = {setting_label(row, key): 2.0 for row, found in grids.items() for key in found}
    mean_nll[setting_label("long_waves_tuned", (1.5, 1.1))] = 1.0
    tuned, settings = pick_tuned(context, grids, mean_nll)
    methods = {**baselines, **tuned, "file:given.json": context.longrope(np.full(context.pairs, 3.0))}
    nll = {name: 2.0 for name in methods} | {"long_waves": 1.0, "file:given.json": 0.5}
    per_window = {name: {str(TARGET): [value, value + 0.1, value - 0.1]} for name, value in nll.items()}
    result = summarize(context, methods, per_window, [TARGET], {**settings, "tuning_grid": {"name": "coarse"}})
    try:
        factors_rows([("long_waves", "given.json")])
        label = None
    except JobConfigError as exc:
        label = str(exc)
    return {
        "baselines": list(BASELINES),
        "nominal": factors_of(baselines["long_waves"]),
        "longrope_attention": [
            factors_of(baselines["long_waves_longrope_attention"]),
            baselines["long_waves_longrope_attention"].attention_factor,
        ],
        "grid": {repr(key): [type(m).__name__, factors_of(m), m.attention_factor] for key, m in grid.items()},
        "tuned": [type(tuned["long_waves_tuned"]).__name__, settings["long_waves_tuned"]],
        "best_baseline": result["best_baseline"],
        "rows": list(result["methods"]),
        "settings_in_result": result["long_waves_tuned"],
        "drawn_as_given": is_given("long_waves"),
        "label_refused": label,
    }


def extrapolation(context) -> dict:
    from longrope.search.reports.extrapolation import ROPE_EXTENSIONS, extension_methods

    plain = context.method
    methods = extension_methods(plain, context.original_length, TARGET, context.longrope(np.ones(context.pairs)))
    return {"extensions": list(ROPE_EXTENSIONS), "factors": factors_of(methods["long_waves"])}


def cli(*argv: str) -> tuple[int, str]:
    from longrope.search.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # --help
            code = exc.code
    return code, out.getvalue()


def commands() -> dict:
    """`longrope encodings list` and `encodings factors` with the new method's own flag, and the GPU table's rows."""
    from gpu_table_parts.plan import TABLE_ROWS

    listed = json.loads(cli("encodings", "list", "--json")[1])
    shape = ["--factor", "4", "--original-length", "16", "--head-dim", "8"]
    code, printed = cli("encodings", "factors", "long_waves", *shape, "--edge", "0.05")
    return {
        "listed": next(entry for entry in listed if entry["name"] == "long_waves"),
        "factors": [code, json.loads(printed)["rope_parameters"]["long_factor"] if code == 0 else printed],
        "edge_flag": "--edge" in cli("encodings", "factors", "--help")[1],
        "table_rows": TABLE_ROWS,
    }


def reported(part, *args) -> dict:
    """A part's findings, or the error it stopped at (so each test fails on its own part, with the traceback)."""
    try:
        return part(*args)
    except Exception:  # any failure is a finding
        return {"error": traceback.format_exc()}


def main() -> None:
    from longrope.search.job.job_context import JobContext
    from longrope.search.optimizers.factory import load_job_config

    context = JobContext.resolve(load_job_config(CONFIGS / "demo.yaml", [f"target_length={TARGET}"]))
    report = {
        "job": {
            "rotary_dim": context.method.rotary_dim,
            "theta": context.method.rope_theta,
            "original": context.original_length,
        },
        "registry": reported(registry),
        "seeds": reported(seeds),
        "compare": reported(compare_rows, context),
        "extrapolation": reported(extrapolation, context),
        "commands": reported(commands),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # gpu_table_parts, as bench/ imports it
    main()
