"""The training loop the shipped checkpoints share: random windows of the training split, AdamW with warmup and
a cosine decay to a tenth, gradient clipping at 1. nanoGPT-plain and deterministic under the recipe's seed (the
window starts come from one numpy generator, the weights from torch's seeded generator)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from longrope.workers.needles import NUMBER_HIGH, NUMBER_LOW, make_needle
from longrope.workers.reference_recipe import TrainingRecipe
from longrope.workers.tokenization import BYTE_TOKENIZER, TextTokenizer

BYTES = TextTokenizer(BYTE_TOKENIZER)


def training_batch(stream: np.ndarray, rng: np.random.Generator, recipe: TrainingRecipe) -> torch.Tensor:
    """Random windows of the stream; with a needle share, that share of rows become needle windows (a number
    hidden at a random depth and asked for at the end), drawn after the plain starts so a share of 0 draws
    exactly what the first recipe drew."""
    length = recipe.train_length
    starts = rng.integers(0, len(stream) - length, size=recipe.batch_size)
    rows = [stream[s : s + length] for s in starts]
    if recipe.needle_share > 0:
        for row in np.flatnonzero(rng.random(recipe.batch_size) < recipe.needle_share):
            number = str(int(rng.integers(NUMBER_LOW, NUMBER_HIGH)))
            haystack = stream[starts[row] : starts[row] + length]
            rows[row] = make_needle(haystack, BYTES, length=length, depth=float(rng.random()), number=number).tokens
    return torch.from_numpy(np.stack(rows))


def learning_rate(recipe: TrainingRecipe, step: int) -> float:
    """Linear warmup over `warmup_steps`, then cosine from the full rate down to a tenth of it."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_steps(
    model: torch.nn.Module,
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    stream: np.ndarray,
    recipe: TrainingRecipe,
    *,
    log: Callable[[str], None] = print,
    checkpoint: Callable[[int], None] | None = None,
    checkpoint_every: int = 1000,
) -> list[float]:
    """Run the recipe's steps on `model` (already seeded and built); returns the loss of every step.
    `checkpoint(step)` runs after every `checkpoint_every` steps (the reference model checks its needles there)."""
    rng = np.random.default_rng(recipe.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay, betas=(0.9, 0.95)
    )
    started, losses = time.monotonic(), []
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        loss = loss_of(training_batch(stream, rng, recipe))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if checkpoint is not None and step % checkpoint_every == checkpoint_every - 1:
            checkpoint(step)
        if step % 200 == 0 or step == recipe.steps - 1:
            log(f"step {step:5d}/{recipe.steps}  loss {losses[-1]:.3f}  {time.monotonic() - started:6.0f}s")
    return losses
