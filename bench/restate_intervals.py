"""Saved tables' statistics computed again from their per-window NLLs, nothing scored: after a change to how an
interval is drawn (normal to Student-t, 2026-12-05), the shipped tables read as today's code writes them.

A table of a real model is hours of forwards (the 2x table on this CPU, the GPU lease), but every row keeps its
per-window mean NLLs, from which `compare.restated` recomputes each perplexity interval and paired difference. Each
file gets a `restated` record (when, by which commit, and why); its table (markdown) and plots are written again:
- a `bench/real_model.py table` result (smollm2_16k.json: `result`, `table`, and its folder smollm2_16k/);
- a `bench/gpu_table.py` result (gpu_table.json: each target's `compare` and `table`, gpu_table.md, and the
  paired-difference plots beside it).

Run: .venv/bin/python bench/restate_intervals.py bench/results/smollm2_16k.json bench/results/smollm2_16k_arms.json \
       bench/results/gpu_table.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchlib import provenance
from gpu_table_parts.run_table import TableResult, draw_paired_difference

from longrope.search.reports.compare import restated, write_outputs
from longrope.search.reports.compare_tables import markdown_table

WHY = "95% intervals over windows drawn with Student's t (n - 1 degrees of freedom) instead of the normal 1.96"


def restatement() -> dict:
    return {**provenance(), "why": WHY}


def restate_real_model_table(path: Path, saved: dict) -> None:
    saved["result"] = restated(saved["result"])
    saved["table"] = markdown_table(saved["result"])
    saved["restated"] = restatement()
    write_outputs(saved["result"], path.with_suffix(""))
    path.write_text(json.dumps(saved, indent=2, default=str) + "\n")


def restate_gpu_table(path: Path) -> None:
    result = TableResult.model_validate_json(path.read_text())
    for entry in result.targets.values():
        if entry.compare is None:
            continue
        entry.compare = restated(entry.compare)
        entry.table = markdown_table(entry.compare)
        draw_paired_difference(entry, path)
    result.provenance["restated"] = restatement()
    path.write_text(result.model_dump_json(indent=1) + "\n")
    path.with_suffix(".md").write_text(result.markdown())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="a saved table's JSON")
    for path in parser.parse_args().results:
        saved = json.loads(path.read_text())
        if "targets" in saved:
            restate_gpu_table(path)
        elif "result" in saved and "table" in saved:
            restate_real_model_table(path, saved)
        else:
            raise SystemExit(f"{path}: neither a real_model.py table nor a gpu_table.py result")
        print(f"restated {path}")


if __name__ == "__main__":
    main()
