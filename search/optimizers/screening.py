"""search.surrogate inside the GA: how many children a generation scores and breeds, and which of the bred are
scored (the ridge surrogate of surrogate.py, fitted on every told score, ranks them; `screen` picks).

Every number here is a function of the told scores and the GA's own generator, so a screened run is deterministic
given its seed and resumes exactly (its counts are in the GA's state; the fit is redone from the told scores).
"""

from __future__ import annotations

import math

import numpy as np

from longrope.search.config.search_section import SearchConfig, SurrogateConfig
from longrope.search.optimizers.genome import Genome, GenomeGrid
from longrope.search.optimizers.surrogate import candidate_features, fit_surrogate, screen


def scored_children(search: SearchConfig) -> int:
    """Children a generation scores: mutations + crossovers, or search.surrogate's share of them (at least 1)."""
    children = search.mutations + search.crossovers
    if not search.surrogate.enabled:
        return children
    return max(1, round(search.surrogate.scored_share * children))


def bred_children(search: SearchConfig) -> tuple[int, int]:
    """(mutations, crossovers) a generation breeds: as configured, or `proposals` x the children it scores, in the
    configured ratio (mutations rounded, crossovers the rest)."""
    if not search.surrogate.enabled:
        return search.mutations, search.crossovers
    bred = search.surrogate.proposals * scored_children(search)
    mutations = round(bred * search.mutations / (search.mutations + search.crossovers))
    return mutations, bred - mutations


class ChildScreen:
    """The GA's screen: picks which bred children are scored, and counts what it proposed and screened out."""

    def __init__(self, settings: SurrogateConfig, grid: GenomeGrid):
        self.settings = settings
        self.grid = grid
        self.proposed = 0  # children bred after generation 0
        self.screened_out = 0  # of those, not scored
        self.last_proposals: list[Genome] = []  # the latest batch, before screening
        self._features: dict[str, np.ndarray] = {}  # a genome's features, by key (decoding is the cost)

    def counts(self) -> tuple[int, int]:
        return self.proposed, self.screened_out

    def screened(
        self,
        batch: list[Genome],
        keep: int,
        scores: dict[str, float],
        genomes: dict[str, Genome],
        rng: np.random.Generator,
    ) -> list[Genome]:
        """The `keep` children of `batch` that `surrogate.screen` picks on the surrogate's predictions (the first
        `keep` while fewer than 2 told scores are finite), in breeding order; `rng` draws the exploration share."""
        self.last_proposals = list(batch)
        if len(batch) > keep:
            surrogate = self.fitted(scores, genomes)
            if surrogate is None:
                batch = batch[:keep]
            else:
                predicted = surrogate.predict(np.stack([self.features(g) for g in batch]))
                batch = [batch[i] for i in screen(predicted, keep, self.settings.exploration, rng)]
        self.proposed += len(self.last_proposals)
        self.screened_out += len(self.last_proposals) - len(batch)
        return batch

    def fitted(self, scores: dict[str, float], genomes: dict[str, Genome]):
        """The surrogate fitted on every genome told a finite score, in the order told; None under 2."""
        keys = [key for key, score in scores.items() if key in genomes and math.isfinite(score)]
        if len(keys) < 2:
            return None
        features = np.stack([self.features(genomes[key]) for key in keys])
        told = np.array([scores[key] for key in keys])
        return fit_surrogate(self.settings.model, features, told, self.settings.ridge, self.settings.noise)

    def features(self, genome: Genome) -> np.ndarray:
        if genome.key not in self._features:
            self._features[genome.key] = candidate_features(self.grid.candidate(genome, 0, None))
        return self._features[genome.key]
