"""A search job: its config resolved into a model, a tokenizer, windows and seeds (`JobContext`), every check made
before anything is written (`validation_checks`), and its start or resume (`jobs`): the run directory's lock, then
the coordinator."""
