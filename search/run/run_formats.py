"""The run directory's format versions, and how older shapes are read.

A run directory lives for weeks of GPU time and outlives the code that wrote it, so every file a run holds is read
by every later release. config.json and state.json carry `format`:

- format 5 (this release, 2026-12-06): as format 4, but the steady GA's state no longer holds the early stop's
  best after each generation (`early_stop` is null): history.jsonl's lines are in the order the GA was told
  them, one at a time, so a resume replays the bests from there (`DimMonoEvolution.resume`). It keeps its
  generator, parents, asks out and counts; how the search stopped is state.json's `progress`.
- format 4 (2026-12-05, 8ed38f5 to a097ad3): as format 3, but the steady GA's state no longer holds its told
  genomes and scores (`told` is null): a resume takes them from history.jsonl. It kept the early stop's bests,
  as every older steady state did; today's code does not read them: it replays them from the history, as for
  format 5. (Code from deb854c to 9243a19 re-sent a resumed steady run's asks out in the order asked, so a line
  it re-sent may stand out of the order it was told in where the GA then had no new child to ask; such a run's
  replayed bests may differ from its stored ones, which matters only to when its early stop fires.)
- format 3 (2026-12-04, 3371ab4 to 71e00ff): state.json holds only what history.jsonl cannot give, but for the
  steady GA's told scores: `optimizer: {kind, state}` with `state` null for every searcher a replay of the
  history rebuilds (all but the steady GA, whose generator, parents, asks out and told genomes and scores it
  keeps), `progress` (where the search stands, for `status`), how it stopped, and its timings. config.json and
  job.json are as in format 2. Today's code does not read a format-3 steady state's `told`: it takes what the
  GA was told from the history, as for format 4.
- format 2 (2026-12-04, e52c1d0 to 013706b): config.json is `{"format": 2, "config_hash", "config"}`, and
  `config_hash` is the sha256 of the config as written (`JobConfig.hash`), less what never changes a run's
  result (where it is written, who scores it, whether TensorBoard watches it). A reader recomputes it from the
  stored JSON, never from the config as today's code re-reads it, so a field added later with a default, or a
  default changed later, leaves every older run's hash as it was. job.json's `record_hash` is taken the same
  way, over its fields as written. state.json held every searcher's whole state, told scores and a descent's
  Adam moments included: copies of the history. Today's code reads them and uses only the steady GA's; the rest
  is replayed.
- format 1 (no `format` key; every commit from the first search, 2026-11-30, to 2026-12-04): the hash was taken
  over the config re-dumped by the code of the day, with the fields added after the first release (a hand-kept
  list, `LATER_SEARCH_FIELDS` and `LATER_DATA_FIELDS`) left out where they held their defaults. The list missed
  `search.surrogate` (2026-12-03), which made every run written before it unreadable by later code.
  `legacy_hash_matches` reads that rule back from the stored JSON alone.

A directory of a newer format than this code reads is refused in one line that says to upgrade, and nothing is
written to it (`format_problem`).
"""

from __future__ import annotations

import itertools
from typing import Any

from longrope.search.config.job_config import JobConfig, digest, identity_fields, identity_hash
from longrope.search.optimizers.factory import SEARCHERS

FORMAT = 5  # what this code writes, and the newest it reads
# the fields the format-1 hash left out where they held their default: the last version of that hand-kept list
# (it only ever grew), section by section
FORMAT_1_LATER_FIELDS = {
    "search": (
        "gradient",
        "optimizer",
        "schedule",
        "racing",
        "cmaes",
        "space",
        "critical_dim",
        "length_scale",
        "factor",
        "long_factors",
        "stages",
    ),
    "data": ("objective",),
}
# sub-field defaults of a listed section that differ from today's: (section, field, sub-field) -> the older defaults
# (search.gradient.polish_every was 5 from d3b9b7d to a85be3c, 2026-12-01/02)
FORMAT_1_OLDER_DEFAULTS = {("search", "gradient", "polish_every"): (5,)}
# fields added after a run was written whose default is not what that run did: (section, sub-section, field) ->
# (the value that gives the old behaviour, where it is in force), filled in wherever the stored sub-section lacks
# the field, whatever the format (a field absent from a config.json was not there when its run was written): the
# hybrid polished by Adam before `polish_method` existed (2275db4); a screened GA scored every child before
# `scored_share` existed (5366358); CMA-ES was sized by the GA's settings before `cmaes.sizing` existed (its own
# population and generations). Whoever adds a field whose default changes what a run does adds its line here.
OLDER_BEHAVIOUR = {
    ("search", "gradient", "polish_method"): ("adam", lambda search: _polishes(search.get("optimizer", "dim_mono"))),
    ("search", "surrogate", "scored_share"): (1.0, lambda search: search["surrogate"].get("enabled") is True),
    ("search", "cmaes", "sizing"): ("ga", lambda search: True),
}


def format_problem(version: Any) -> str | None:
    """What is wrong with a file's `format` (1 when the file has none: written before formats), None when this code
    reads it. A newer release's format is refused, never guessed at: its fields may mean something else."""
    if type(version) is not int or version < 1:
        return f"format must be a whole number >= 1, got {version!r}"
    if version > FORMAT:
        return (
            f"format {version} was written by a newer longrope-search (this one reads formats 1 to {FORMAT}); "
            "upgrade longrope-search to read it (nothing was changed)"
        )
    return None


def hash_matches(version: int, config: dict[str, Any], stored_hash: Any) -> bool:
    """Whether config.json's `config_hash` is its stored config's, by the rule of the file's format (today's
    defaults are dumped only for a format-1 file, the one rule that needs them)."""
    if version == 1:
        return legacy_hash_matches(config, stored_hash, JobConfig.defaults())
    return stored_hash == identity_hash(config)


def legacy_hash_matches(config: dict[str, Any], stored_hash: Any, defaults: dict[str, Any]) -> bool:
    """Whether a format-1 config.json's `config_hash` is its stored config's (`defaults`: a config with no field
    set, as today's code dumps it to JSON).

    The format-1 rule dropped a later field from the hash where it held the default of its day, and which fields
    the list held on that day is not in the file, so every subset of the later fields at their default here is
    tried (at most 2^12 small hashes). A section's default of its day is today's, restricted to the keys the file
    holds (sections only ever gained keys). Only fields at their default may be dropped, so an edit of any value
    still changes the hash and is refused."""
    identity = identity_fields(config)
    droppable = [
        (section, name)
        for section, names in FORMAT_1_LATER_FIELDS.items()
        for name in names
        if isinstance(identity.get(section), dict)
        and name in identity[section]
        and _at_default(identity[section][name], defaults.get(section, {}).get(name), (section, name))
    ]
    for size in range(len(droppable), -1, -1):
        for dropped in itertools.combinations(droppable, size):
            trial = identity_fields(identity)
            for section, name in dropped:
                del trial[section][name]
            if digest(trial) == stored_hash:
                return True
    return False


def _at_default(value: Any, default: Any, where: tuple[str, ...]) -> bool:
    """A stored value equals the default of its day: today's or an older one (FORMAT_1_OLDER_DEFAULTS), and for a
    section, on the keys it holds."""
    if isinstance(value, dict) and isinstance(default, dict):
        return all(key in default and _at_default(item, default[key], (*where, key)) for key, item in value.items())
    return value == default or value in FORMAT_1_OLDER_DEFAULTS.get(where, ())


def _polishes(optimizer: Any) -> bool:
    return getattr(SEARCHERS.get(optimizer), "polishes", False)


def with_older_behaviour(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config as today's model reads it with the behaviour its run had: OLDER_BEHAVIOUR filled in where a
    sub-section lacks the field (a copy; the stored file and its hash are left as they are)."""
    config = {name: dict(value) if isinstance(value, dict) else value for name, value in config.items()}
    for (section, sub_section, name), (value, in_force) in OLDER_BEHAVIOUR.items():
        part = config.get(section)
        sub = part.get(sub_section) if isinstance(part, dict) else None
        if isinstance(sub, dict) and name not in sub and in_force(part):
            part[sub_section] = {**sub, name: value}
    return config
