"""Scoring candidates: negative log-likelihood per window of a causal LM under each candidate's RoPE.

B candidates share one forward pass over B copies of a window (the rope patch gives each batch row its own
frequencies). The loss is computed from the final hidden states in chunks of positions, so the
`[tokens, vocab]` logits never exist at once: at 128k tokens and a 128k vocabulary they would be 64 GB.
Results are summed NLL and token counts per window, so callers can form perplexities, paired differences
between candidates on the same windows, and confidence intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longrope.encodings import RopeMethod
from longrope.workers.rope_patch import patch_rotary, restore_rotary


@dataclass(frozen=True)
class CandidateScore:
    """Summed NLL (nats) and predicted-token count per window, in window order."""

    nll: tuple[float, ...]
    tokens: tuple[int, ...]
    # counted predictions whose argmax is not the target, per window (windows with a loss mask only): 0 means
    # greedy decoding reproduces the counted tokens exactly (a needle's answer retrieved)
    misses: tuple[int, ...] | None = None

    @property
    def mean_nll(self) -> float:
        """NLL per token over all windows (NaN/inf stay as they are, for the caller to rank last)."""
        return sum(self.nll) / sum(self.tokens)

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll) if math.isfinite(self.mean_nll) else math.inf


def chunked_nll(
    hidden: torch.Tensor, targets: torch.Tensor, lm_head, *, chunk_tokens: int, logit_softcap: float | None = None
) -> torch.Tensor:
    """Summed NLL per row of `hidden` [B, T, H] predicting `targets` [B, T], `chunk_tokens` positions at a time."""
    return chunked_loss(hidden, targets, lm_head, chunk_tokens=chunk_tokens, logit_softcap=logit_softcap)[0]


def chunked_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head,
    *,
    chunk_tokens: int,
    logit_softcap: float | None = None,
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL, argmax misses) per row of `hidden` [B, T, H] predicting `targets` [B, T], `chunk_tokens`
    positions at a time, counting only the positions where `loss_mask` [B, T] is True (all where None; misses
    are counted only with a mask). Chunks with nothing to count are skipped, so a needle's loss (a few answer
    tokens) costs almost no lm_head work."""
    rows = hidden.shape[0]
    total = torch.zeros(rows, dtype=torch.float64, device=hidden.device)
    misses = torch.zeros(rows, dtype=torch.long, device=hidden.device)
    step = max(1, chunk_tokens // rows)
    for start in range(0, hidden.shape[1], step):
        chunk_mask = None if loss_mask is None else loss_mask[:, start : start + step]
        if chunk_mask is not None and not bool(chunk_mask.any()):
            continue
        logits = lm_head(hidden[:, start : start + step]).float()
        if logit_softcap:
            logits = torch.tanh(logits / logit_softcap) * logit_softcap
        chunk_targets = targets[:, start : start + step].reshape(-1)
        losses = F.cross_entropy(logits.flatten(0, 1), chunk_targets, reduction="none").view(rows, -1).double()
        if chunk_mask is not None:
            losses = torch.where(chunk_mask, losses, 0.0)  # a masked-out NaN must not reach the sum
            wrong = logits.argmax(dim=-1) != targets[:, start : start + step]
            misses += (wrong & chunk_mask).sum(dim=1)
        total += losses.sum(dim=1)
        del logits, losses  # free this chunk before the next one is computed, so only one exists at a time
    return total, misses


# Tokens per forward pass when stacking short windows: a CPU runs fastest per token on ~2k-token forwards (bigger
# activations fall out of cache; measured with bench/scoring.py), a GPU needs far more rows to fill its SMs.
DEFAULT_TOKENS_PER_FORWARD = {False: 2048, True: 16384}


class Scorer:
    """Scores candidates on fixed token windows with one loaded model (the model is patched while scoring)."""

    def __init__(
        self,
        model,
        windows: torch.Tensor,
        original_inv_freq: torch.Tensor,
        *,
        candidates_per_forward: int = 4,
        tokens_per_forward: int | None = None,
        loss_chunk_tokens: int = 1024,
        loss_mask: torch.Tensor | None = None,
    ):
        """`loss_mask` [count, length - 1] bool: which predictions of each window count (None: all)."""
        if windows.ndim != 2 or windows.shape[1] < 2:
            raise ValueError(f"windows: expected [count, length >= 2] token ids, got shape {tuple(windows.shape)}")
        expected = (windows.shape[0], windows.shape[1] - 1)
        if loss_mask is not None and tuple(loss_mask.shape) != expected:
            raise ValueError(f"loss_mask: expected shape {expected}, got {tuple(loss_mask.shape)}")
        self.model = model
        self.device = next(model.parameters()).device
        self.windows = windows.to(self.device, dtype=torch.long)
        self.loss_mask = None if loss_mask is None else loss_mask.to(self.device, dtype=torch.bool)
        counts = (windows.shape[1] - 1,) * len(windows) if loss_mask is None else loss_mask.sum(dim=1).tolist()
        self.counted_tokens = tuple(int(count) for count in counts)
        self.original_inv_freq = original_inv_freq
        self.candidates_per_forward = max(1, candidates_per_forward)
        self.tokens_per_forward = tokens_per_forward or DEFAULT_TOKENS_PER_FORWARD[self.device.type == "cuda"]
        self.loss_chunk_tokens = loss_chunk_tokens
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)

    @property
    def context_length(self) -> int:
        """Tokens in each forward pass: a window of n + 1 tokens is read at n positions, predicting n tokens."""
        return self.windows.shape[1] - 1

    def windows_per_forward(self, candidates: int, windows: int | None = None) -> int:
        """Short windows are stacked so each forward reads about `tokens_per_forward` tokens (one window at least):
        a 128-token window alone leaves most of a GPU, or the CPU's matmul units, idle."""
        count = len(self.windows) if windows is None else windows
        return max(1, min(count, self.tokens_per_forward // (candidates * self.context_length)))

    @torch.inference_mode()
    def score(self, candidates: Sequence[RopeMethod], windows: tuple[int, int] | None = None) -> list[CandidateScore]:
        """One CandidateScore per candidate, in order, on windows [start, stop) (None: all); every candidate sees
        exactly the same windows, so scores pair window by window (what racing compares).

        Each forward pass reads B candidates x K windows as B*K batch rows, candidate-major, and the rope patch
        gives every row its candidate's frequencies."""
        begin, end = (0, len(self.windows)) if windows is None else windows
        if not 0 <= begin < end <= len(self.windows):
            raise ValueError(f"windows: expected 0 <= start < stop <= {len(self.windows)}, got [{begin}, {end})")
        nll = torch.zeros(len(candidates), end - begin, dtype=torch.float64)
        misses = torch.zeros(len(candidates), end - begin, dtype=torch.long)
        patched, original = patch_rotary(self.model, self.original_inv_freq)
        try:
            for first in range(0, len(candidates), self.candidates_per_forward):
                group = candidates[first : first + self.candidates_per_forward]
                per_forward = self.windows_per_forward(len(group), end - begin)
                for start in range(begin, end, per_forward):
                    rows = self.windows[start : min(start + per_forward, end)]
                    patched.set_candidates(group, seq_len=self.context_length, rows_each=len(rows))
                    batch = rows.repeat(len(group), 1)
                    stop = min(start + per_forward, end)
                    mask = None if self.loss_mask is None else self.loss_mask[start:stop].repeat(len(group), 1)
                    rows_nll, rows_misses = self._batch_loss(batch, mask)
                    column = start - begin
                    block = (slice(first, first + len(group)), slice(column, column + len(rows)))
                    nll[block] = rows_nll.view(len(group), len(rows)).cpu()
                    misses[block] = rows_misses.view(len(group), len(rows)).cpu()
        finally:
            restore_rotary(self.model, original)
        tokens = self.counted_tokens[begin:end]
        return [
            CandidateScore(
                nll=tuple(row.tolist()),
                tokens=tokens,
                misses=None if self.loss_mask is None else tuple(int(v) for v in missed),
            )
            for row, missed in zip(nll, misses, strict=True)
        ]

    def _batch_loss(self, batch: torch.Tensor, loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # use_cache=False: scoring never decodes on, and a DynamicCache would keep every layer's keys and values
        # alive to the end of the forward (16 GiB for a 7B model at 32k tokens)
        hidden = self.model.model(input_ids=batch[:, :-1], use_cache=False).last_hidden_state
        return chunked_loss(
            hidden,
            batch[:, 1:],
            self.model.lm_head,
            chunk_tokens=self.loss_chunk_tokens,
            logit_softcap=self.logit_softcap,
            loss_mask=loss_mask,
        )
