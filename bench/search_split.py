"""The searched factors and the tuning grid on the search windows: the split where the search picked its factors
and the tuned baselines picked their settings.

The test table says how a searched row reads on held-out documents. When it loses to a tuned closed form, or wins
by less than hoped, this tells why:
- the searched factors beat the best tuned setting on the search windows but not on the test windows: the search
  fitted its few windows (more windows, not more budget);
- they lose on the search windows too: the budget or the seeds stopped the search short of what the tuned
  baseline found (more steps, or the tuned setting as a seed);
- they tie there: the space itself, or the test documents, set the limit.

Perplexity on a set of windows is exp(sum of NLL / sum of tokens), as the search's own mean_nll (its windows hold
equal token counts). The scores go to the table's score log (`bench/real_model.py`, set "tuning"), so a killed run
resumes and the table's tuning forwards are not repeated: the grid's scores are read from the log, and only the
factors files are scored here (2 windows each).

It writes <stem>_search_split.json and a bar chart of every row's perplexity there, <stem>_search_split.png
(`--replot`: the chart again from the saved JSON, nothing loaded or scored).

Run (after the table's tuning, `bench/real_model.py table --config ...`):
  .venv/bin/python bench/search_split.py --config configs/smollm2-135m-32k-cpu.yaml \
    --factors bench/results/smollm2_32k_factors.json --factors bench/results/smollm2_16k_factors.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchlib import RESULTS, provenance, save_json
from real_model import CONFIG, WindowScorer, score_log, stem, tuned, window_ids

from longrope.search.config.tuning_grids import TUNING_GRIDS
from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.compare_rows import factors_rows, given_methods
from longrope.search.reports.tuned_baselines import setting_label, tuning_grids


def split_perplexities(log, length: int, labels, ids: list[str]) -> dict[str, float | None]:
    """exp(sum NLL / sum tokens) over the windows `ids` of each label (None while a window is missing)."""
    found = {}
    for label in labels:
        scores = [log.scores.get(("tuning", length, label, window)) for window in ids]
        if None in scores:
            found[label] = None
            continue
        found[label] = math.exp(sum(nll for nll, _ in scores) / sum(tokens for _, tokens in scores))
    return found


def plot_split(split: dict, path: Path) -> None:
    """Each row's perplexity on the search windows, best at the top: the factors files in red, each grid's best
    setting (the one its tuned row takes: the lowest NLL there) in blue, the other settings in grey; the axis starts
    near the best, so percent-level gaps show (rows far off the scale are cut, their value written beside them)."""
    from matplotlib.figure import Figure

    rows = sorted(((label, ppl) for label, ppl in split["perplexity"].items() if ppl is not None), key=lambda r: r[1])
    tuned_rows = [name for name in split["tuned"] if name.endswith("_tuned")]  # ntk_tuned, yarn_tuned
    picks = {next(label for label, _ in rows if label.startswith(f"{name} ")) for name in tuned_rows}
    best = rows[0][1]
    limit = best * 1.25
    fig = Figure(figsize=(9, 0.32 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    for place, (label, ppl) in enumerate(rows):
        colour = "tab:red" if label.startswith("file:") else "tab:blue" if label in picks else "tab:gray"
        ax.barh(place, min(ppl, limit) - best * 0.95, left=best * 0.95, color=colour)
        ax.text(min(ppl, limit), place, f" {ppl:.3f}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label + (" (best of its grid)" if label in picks else "") for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(best * 0.95, limit * 1.06)
    ax.set_xlabel(f"perplexity on the {len(split['windows'])} search windows at {split['length']} tokens")
    ax.set_title("Where both were chosen: searched factors (red), each tuning grid's best (blue)", fontsize=10)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG), help="the search's config: its model, data and lengths")
    parser.add_argument("--factors", action="append", required=True, help="a search's export; repeatable")
    parser.add_argument("--grid", choices=sorted(TUNING_GRIDS), default="coarse")
    parser.add_argument("--results", default=str(RESULTS), help="where the log and the results go")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--replot", action="store_true", help="only the chart, from the saved JSON")
    args = parser.parse_args()
    config = load_job_config(Path(args.config), args.set)
    if args.replot:
        saved = Path(args.results) / f"{stem(config)}_search_split.json"
        plot_split(json.loads(saved.read_text()), saved.with_suffix(".png"))
        return
    context = JobContext.resolve(config)
    log = score_log(args.results, context)
    scorer = WindowScorer(context, log)
    files, _ = given_methods(context, factors_rows(args.factors), print)
    log.check_methods(files)
    _, settings = tuned(context, scorer, args.grid)  # the grid, scored where the log lacks it
    data, length = config.data, context.target_length
    windows = context.windows(data.search_source, length, data.search_windows)
    scorer.score("tuning", length, windows, files)
    grid = [setting_label(name, key) for name, found in tuning_grids(context, args.grid).items() for key in found]
    ids = window_ids(windows)
    perplexity = split_perplexities(log, length, [*files, *grid], ids)
    split = {"length": length, "windows": ids, "tuned": settings, "perplexity": perplexity}
    saved = save_json(Path(args.results) / f"{stem(config)}_search_split.json", {**provenance(), **split})
    plot_split(split, saved.with_suffix(".png"))
    for label, value in sorted(perplexity.items(), key=lambda item: item[1] or math.inf):
        print(f"{value:9.4f}  {label}")


if __name__ == "__main__":
    main()
