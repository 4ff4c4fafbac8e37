"""bench/gpu_table.py's parts, one module each (the script is their entry point, its docstring says what the whole
does): `profiles` (each model's table: lengths, windows, searches, how its GGUF is cut), `bundle` (the windows and
bundle.json the last run carries), `gguf_weights` (the GGUF dequantized there and checked against the reference),
`device_runs` (the runs of the `run` tool), `prepare` (here), `run_table`, `plan`, `searching` and `table` (there),
and `dry` and `dry_gemma3` (the dry run's tiny Llama and tiny Gemma 3). Imported as `gpu_table_parts` (bench/ is on
the path when a script runs), never by another bench script."""
