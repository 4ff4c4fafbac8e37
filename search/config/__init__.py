"""What a job is told: the job config (pydantic, strict), the YAML reader under it, the factors file format,
and the generator of the config's field reference. Imports nothing of the search but itself."""
