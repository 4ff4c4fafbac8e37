"""The search service: job config, evolution, coordinator, run store, export and the `longrope` CLI.

Decides what to try next and persists everything; the workers score, the encodings compute frequencies.
"""
