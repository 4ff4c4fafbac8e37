"""The estimate's busy share of the workers (search/cost/utilisation.py), worked by hand: greedy list scheduling,
the ranges a descent generation goes out in (the coordinator's own cut), a whole descent, and the wall line."""

from __future__ import annotations

import json

import pytest

from longrope.search.cli.main import main
from longrope.search.cost.utilisation import MEASURED_GA, descent_time, generation_pieces, makespan, utilisation
from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.window_ranges import candidate_ranges


def descent_job(*overrides: str):
    settings = ["target_length=256", "data.search_windows=8", "search.optimizer=gradient", "search.seeds=[pi]"]
    return load_job_config(None, [*settings, "search.gradient.steps=2", "workers.num_workers=3", *overrides])


def test_greedy_list_scheduling_by_hand():
    """[3, 3, 2, 2, 2] on 2 workers: 3 | 3, then 2 to each (5 | 5), then the last 2 to the first free: 7."""
    assert makespan([3, 3, 2, 2, 2], 2) == 7
    assert makespan([5], 4) == 5 and makespan([1, 1, 1, 1], 4) == 1


def test_a_step_goes_out_as_the_coordinator_cuts_it():
    """8 windows, gradient [0, 6), 3 workers, c = 2: the gradient windows (weight 6 x 3 = 18) and the held-out [6, 8)
    (2) get a piece each, the third goes to the heavier: [0, 3), [3, 6) with a backward pass (3 x 3 = 9 each) and
    [6, 8) (2), costliest first; a lone forward candidate [0, 2), [2, 5), [5, 8); 3 seeds on 3 workers whole."""
    assert candidate_ranges(8, (0, 6), 3) == [((0, 3), True), ((3, 6), True), ((6, 8), False)]
    assert generation_pieces(1, 8, 3, (0, 6), 2.0) == [9.0, 9.0, 2.0]
    assert generation_pieces(1, 8, 3, None, 2.0) == [2.0, 3.0, 3.0]
    assert generation_pieces(3, 8, 3, None, 2.0) == [8.0, 8.0, 8.0]


def test_more_pieces_than_parts_go_to_the_heaviest_part():
    """16 windows, gradient [0, 14), 8 workers: the held-out [14, 16) keeps its one piece (weight 2) and the gradient
    windows (weight 42) take the other 7, 2 windows each (6): no range weighs more than 6, and 8 ranges, one a
    worker."""
    ranges = candidate_ranges(16, (0, 14), 8)
    assert len(ranges) == 8 and ranges[-1] == ((14, 16), False)
    assert [r for r, backward in ranges if backward] == [(k, k + 2) for k in range(0, 14, 2)]


def test_a_descent_s_utilisation_worked_by_hand():
    """One seed, 2 steps, the rounding, on 3 workers, c = 2: the seed [2, 3, 3] lasts 3 (work 8); each step
    [9, 9, 2] lasts 9 (work 20); the rounding 3 (work 8). 56 of work in 24, on 3 workers: 56 / 72."""
    config = descent_job()
    assert descent_time(config, 8, 3, 2.0, seeds=1, steps=2) == (56.0, 24.0)
    assert utilisation(config, 8, 2.0).value == pytest.approx(56 / 72)
    assert utilisation(descent_job("workers.num_workers=1"), 8, 2.0).value == 1.0


def test_the_ga_takes_the_measured_share_and_the_wall_line_divides_by_it(capsys):
    """The generational GA on 8 GPUs: the measured 0.807, and the wall hours are the device hours / 8 / 0.807."""
    config = ["--gpu", "H100-SXM", "--json", "--set", "workers.num_workers=8", "--set", "target_length=16384"]
    assert main(["estimate", "configs/llama3-8b-64k.yaml", *config]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["utilisation"]["value"] == MEASURED_GA[("generational", False)]
    assert device["wall_hours"] == pytest.approx(device["hours"] / 8 / 0.807)


def test_line_search_trials_go_out_together():
    """Two trials of a step on 3 workers: each cut in ceil(3 / 2) = 2, the gradient [0, 6) whole (6 x 3 = 18) and the
    held-out [6, 8) (2): [18, 2] twice. Greedy on 3 workers: 18 | 2 | 18, the last 2 after the first 2: 18."""
    pieces = generation_pieces(2, 8, 3, (0, 6), 2.0)
    assert pieces == [18.0, 2.0] * 2
    assert makespan(pieces, 3) == 18.0


def test_the_plan_counts_each_polish_step_s_trials(capsys):
    """A hybrid polished by 10 steps of 3 trials: the first step scores the start alone, the other 9 three trials
    each, 28 points a polish where one trial a step scores 10."""
    settings = ["--set", "search.optimizer=hybrid", "--set", "search.gradient.polish_probes=3", "--json"]
    assert main(["estimate", "configs/demo.yaml", *settings]) == 0
    steps = json.loads(capsys.readouterr().out)["gradient_steps"]
    assert main(["estimate", "configs/demo.yaml", "--set", "search.optimizer=hybrid", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)["gradient_steps"]
    assert one > 0 and one % 10 == 0 and steps == one // 10 * 28
