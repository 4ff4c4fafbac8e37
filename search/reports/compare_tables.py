"""compare.md's perplexity table: what it measures, its units, the windows and which way is better written above
it (the table is read away from the code), and the best value of each column in bold."""

from __future__ import annotations

import math

from longrope.search.reports.compare_result import SHIPPED, VLLM_SUFFIX, CompareResult


def window_counts(result: CompareResult) -> dict[str, int]:
    """Test windows per length: compare.json's `windows`, or (an older result) the per-window NLLs of a row."""
    if "windows" in result:
        return {str(n): int(count) for n, count in result["windows"].items()}
    row = next(iter(result["methods"].values()))
    per_window = {str(n): values for n, values in row["nll_per_window"].items()}
    return {str(n): len(per_window[str(n)]) for n in result["lengths"]}


def describe_windows(counts: dict[str, int]) -> str:
    if len(set(counts.values())) == 1:
        count = next(iter(counts.values()))
        return f"{count} window{'' if count == 1 else 's'} at every length"
    return "windows per length: " + ", ".join(f"{n}: {count}" for n, count in counts.items())


def markdown_table(result: CompareResult) -> str:
    """compare.md's perplexity table, with what it measures, its units, how many windows and which way is better
    written above it (the table is read away from the code), and the best value of each column in bold."""
    lengths, target, best = result["lengths"], result["target_length"], result["best_baseline"]
    header = ["method", *[f"ppl @ {n}" for n in lengths], f"Δ NLL vs {best} @ {target}"]
    rows = result["methods"]
    perplexities = [_column_cells([row["perplexity"][str(n)] for row in rows.values()], "{:.3f}") for n in lengths]
    differences = _column_cells([row.get("paired_difference_to_best_baseline") for row in rows.values()], "{:+.4f}")
    cells = [*perplexities, differences]
    start = result.get("start_length", result["original_length"])
    costs = [row.get("paired_difference_to_shipped") for row in rows.values()]
    if any(costs):
        header.append(f"Δ NLL vs {SHIPPED} @ {start}")
        cells.append(_column_cells(costs, "{:+.4f}"))
    lines = [
        f"Test split, {describe_windows(window_counts(result))}. **Lower is better** in every column. "
        "ppl: perplexity = exp(mean NLL per token over the windows), with its 95% interval over windows. "
        f"Δ NLL: mean paired difference in NLL per token (nats/token) to {best}, the best baseline at {target} "
        f"tokens, on the same windows (negative: better than {best}), with its 95% interval. "
        "**Bold**: the best value of its column."
        + (f" {start_cost_note(start, result['original_length'])}" if any(costs) else ""),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for k, name in enumerate(rows):
        lines.append("| " + " | ".join([name, *[column[k] for column in cells]]) + " |")
    if any(row.get("runtime") == "vllm" for row in rows.values()):
        lines += [
            "",
            f"Rows marked {VLLM_SUFFIX}: the method as a vLLM engine with max_model_len = {target} applies it, "
            "long factors and long_mscale at every length (vLLM fixes the regime per engine; transformers switches "
            "to the long factors only past the original length). The other methods apply the same in both.",
        ]
    return "\n".join(lines)


def start_cost_note(start: int, original: int) -> str:
    """What the last column measures: each method against the model as shipped, where the model already works."""
    where = "the length it was pre-trained for" if start == original else "the length its own RoPE scaling serves"
    return (
        f"Δ NLL vs {SHIPPED} @ {start}: the same paired difference at {start} tokens, {where}, to the model as "
        "its config.json runs it: what each method costs where the model already works. An export's short factors "
        "reproduce the model there, so for a searched row it is what its attention factor costs."
    )


def _column_cells(column: list, number: str) -> list[str]:
    """One column's cells, "value [low, high]", the lowest value in bold (every row that shows it, ties too)."""
    best = min((cell[0] for cell in column if cell and math.isfinite(cell[0])), default=None)
    best_text = number.format(best) if best is not None else None
    out = []
    for cell in column:
        if not cell:
            out.append("-")
            continue
        value = number.format(cell[0])
        shown = f"**{value}**" if value == best_text else value
        out.append(f"{shown} [{number.format(cell[1])}, {number.format(cell[2])}]")
    return out
