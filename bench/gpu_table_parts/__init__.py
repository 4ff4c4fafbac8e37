"""bench/gpu_table.py's parts, one module each (the script is their entry point, its docstring says what the whole
does): `bundle` (the windows and bundle.json the last run carries), `gguf_weights` (the GGUF dequantized there and
checked against the reference), `device_runs` (the runs of the `run` tool), `prepare` (here), `run_table`,
`plan`, `searching` and `table` (there) and `dry` (the dry run's
tiny model). Imported as `gpu_table_parts` (bench/ is on the path when a script runs), never by another bench
script."""
