"""The search service: the command line, the job config, the optimizers, the run, reports, export and cost.

Decides what to try next and persists everything; the workers score, the encodings compute frequencies.
Imports flow one way: cli -> reports -> export, cost -> run -> optimizers -> config (tests/test_import_graph.py).
"""
