"""LongRoPE2-era search features end to end on the reference model: progressive stages (seeded stage by stage,
resumable at any stage, exported from the last), short-factor search (checked against transformers' own short
regime), and searches scored by the tail and needle objectives."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from longrope.search.export.factors_export import ExportError, factors_file_of_run, write_export
from longrope.search.job.job_context import JobContext
from longrope.search.job.jobs import run_search
from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.run_store import RunDir, best_of
from longrope.search.run.stages import stage_dir
from longrope.workers.reference_recipe import reference_model_dir

pytestmark = pytest.mark.slow

TINY = [
    "data.search_windows=3",
    "search.seeds=[pi, ntk, yarn]",  # the paper's three, not the tuned grids: the counts are worked for them
    "search.population=6",
    "search.parents=3",
    "search.mutations=2",
    "search.crossovers=2",
    "search.generations=1",
    "workers.num_workers=1",
    "workers.local_num_cpus=2",
    "workers.batch_size=2",
]


def run(config):
    return run_search(config)


@pytest.fixture(scope="module", autouse=True)
def shutdown_ray():
    yield
    ray.shutdown()


def test_progressive_stages_seed_each_stage_from_the_last_and_resume_at_any_stage(tmp_path):
    out = tmp_path / "job"
    config = load_job_config(None, [*TINY, "target_length=1024", "search.stages=[256, 512]", f"output_dir={out}"])
    best = run(config)
    folders = [stage_dir(out, k, n) for k, n in enumerate((256, 512, 1024))]
    stage_best = [best_of(RunDir(folder).read_history()) for folder in folders]
    assert best == stage_best[-1]
    for earlier, later, length in ((folders[0], folders[1], 512), (folders[1], folders[2], 1024)):
        previous = best_of(RunDir(earlier).read_history())
        seeds = {r.seed: r for r in RunDir(later).read_history().values() if r.seed}
        name = f"file:{earlier.name}"
        np.testing.assert_allclose(seeds[name].factors, previous.factors, atol=0.005 + 1e-9)
        ratio = (length / 128 - 1) / (RunDir(earlier).read_config().target_length / 128 - 1)
        moved = 1 + (np.asarray(previous.factors) - 1) * ratio  # LongRoPE's dynamic form, worked here
        np.testing.assert_allclose(
            seeds[f"{name}@{length}"].factors, np.minimum(moved, 1.25 * length / 128), atol=0.005 + 1e-9
        )
    assert factors_file_of_run(RunDir(out)) == factors_file_of_run(RunDir(folders[-1]))
    # the job directory as another search's seed: its last stage's best
    seed = JobContext.resolve(config).seed_from_file(str(out))
    assert seed.factors.tolist() == stage_best[-1].factors
    # a lost last stage is searched again from the stage before it, to the same result
    shutil.rmtree(folders[-1])
    assert run_search(None, resume_dir=out) == best


def test_short_factor_search_keeps_the_long_factors_and_matches_transformers_short_regime(tmp_path):
    long_run = tmp_path / "long"
    run(
        load_job_config(
            None, [*TINY, "target_length=1024", "search.attention_factor.mode=searched", f"output_dir={long_run}"]
        )
    )
    long_file = tmp_path / "long.json"
    long_file.write_text(factors_file_of_run(RunDir(long_run)).model_dump_json())
    short_run = tmp_path / "short"
    config = load_job_config(
        None,
        [
            *TINY,
            "target_length=1024",
            "search.factor=short",
            f"search.long_factors={long_file}",
            f"output_dir={short_run}",
        ],
    )
    best = run(config)
    exported = factors_file_of_run(RunDir(short_run)).rope_parameters
    kept = json.loads(long_file.read_text())["rope_parameters"]
    assert exported.long_factor == kept["long_factor"]
    assert exported.attention_factor == pytest.approx(kept["attention_factor"])
    np.testing.assert_allclose(exported.short_factor, best.factors)
    # as another search's seed, a short-factor run gives the long factors it kept, not its short ones
    seed = JobContext.resolve(config).seed_from_file(str(short_run))
    assert seed.factors.tolist() == kept["long_factor"]
    # transformers itself, given the exported block, reads windows of original_length with the short factors;
    # with short factors of 1 (the kept attention factor still applied), it gives the "ones" seed's score
    windows = JobContext.resolve(config).objective_windows("corpus:search", 128, 3)
    assert windows.tokens.shape == (3, 129)
    ones = next(r for r in RunDir(short_run).read_history().values() if r.seed == "ones")
    unit = exported.model_copy(update={"short_factor": [1.0] * len(exported.short_factor)})
    assert ones.mean_nll == pytest.approx(transformers_nll(windows.tokens, unit), rel=1e-4)
    assert best.mean_nll == pytest.approx(transformers_nll(windows.tokens, exported), rel=1e-4)
    # the release's CSV holds the long factors only: a file whose short factors were searched is refused
    searched = exported.model_copy(update={"short_factor": [1.0 + 0.01 * k for k in range(len(kept["long_factor"]))]})
    factors = factors_file_of_run(RunDir(short_run)).model_copy(update={"rope_parameters": searched})
    with pytest.raises(ExportError, match=r"--format csv: .* searched short factors too"):
        write_export(factors, tmp_path / "f.csv", "csv")
    assert not (tmp_path / "f.csv").exists() and not (tmp_path / "f.csv.json").exists()


def transformers_nll(tokens: np.ndarray, block) -> float:
    """The mean NLL per token transformers' Llama gives the reference model's weights on `tokens` (n + 1 tokens
    read at n positions, as the scorer does), with `block` as its rope_parameters, the model's length 1024."""
    model = AutoModelForCausalLM.from_pretrained(reference_model_dir())
    model.config.rope_parameters = block.model_dump(exclude_none=True)
    model.config.max_position_embeddings = 1024
    hf = AutoModelForCausalLM.from_config(model.config)
    hf.load_state_dict(model.state_dict())
    hf.eval()
    losses = []
    for window in torch.from_numpy(tokens):
        with torch.no_grad():
            logits = hf(input_ids=window[None, :-1]).logits[0]
        losses.append(float(torch.nn.functional.cross_entropy(logits.float(), window[1:])))
    return float(np.mean(losses))


@pytest.mark.parametrize(("objective", "tokens"), [("tail", [1024 - 128] * 3), ("{perplexity: 1, needle: 3}", None)])
def test_search_scores_each_candidate_by_its_objective(objective, tokens, tmp_path):
    config = load_job_config(
        None, [*TINY, "target_length=1024", f"data.objective={objective}", f"output_dir={tmp_path}"]
    )
    run(config)
    for record in RunDir(tmp_path).read_history().values():
        nll, counts = record.nll, record.tokens
        if tokens is not None:  # the tail: NLL per token over the positions past original_length
            assert counts == tokens
            worked = sum(nll) / sum(counts)
        else:
            # interleaved: perplexity, needle, perplexity, ...; a needle counts " " + 7 digits; weights 1 and 3
            assert counts[::2] == [1024] * 3 and counts[1::2] == [8] * 3
            worked = (sum(nll[::2]) / sum(counts[::2]) + 3 * sum(nll[1::2]) / sum(counts[1::2])) / 4
        assert record.mean_nll == pytest.approx(worked, rel=1e-12)
