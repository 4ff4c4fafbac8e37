"""bench/search_cost.py's parts, one module each (the script is their entry point, its docstring says what each
measures): `variants` (what is compared, the budgets and targets, running a variant), `backward_cost_c` (c, measured
first), `model_part` (1, the demo's scale), `x16_part` (2, 16x against tuned baselines), `cluster_part` (3, the
simulated cluster) and `plots` (the figures, and `--replot`). Imported as `search_cost_parts` (bench/ is on the path
when a script runs), never by another bench script."""
