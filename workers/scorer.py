"""Scoring candidates: negative log-likelihood per window of a causal LM under each candidate's RoPE.

B candidates share one forward pass over B copies of a window (the rope patch gives each batch row its own
frequencies). The loss is computed from the final hidden states in chunks of positions, so the
`[tokens, vocab]` logits never exist at once: at 128k tokens and a 128k vocabulary they would be 64 GB.
Results are summed NLL and token counts per window, so callers can form perplexities, paired differences
between candidates on the same windows, and confidence intervals.

The NLL is differentiable in a LongRoPE candidate's factors and attention factor: positions reach the model only
through cos/sin of `p * inv_freq_i / lambda_i`, times the attention factor. `Scorer.score_with_gradient` returns
that gradient per window, from one backward pass per forward, with the model's weights frozen and every decoder
layer (and every loss chunk) checkpointed, so a long window costs the forward's memory plus one hidden state per
layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from longrope.encodings import LongRope, RopeMethod
from longrope.workers.families import LogitTransform, decoder_of, family_of
from longrope.workers.host_memory import return_freed_memory
from longrope.workers.rope_patch import patched_rotary
from longrope.workers.sequence_chunks import DEFAULT_MLP_CHUNK_TOKENS, chunked_mlps, wrapped_forwards


@dataclass(frozen=True)
class CandidateScore:
    """Summed NLL (nats) and predicted-token count per window, in window order."""

    nll: tuple[float, ...]
    tokens: tuple[int, ...]
    # counted predictions whose argmax is not the target, per window (windows with a loss mask only): 0 means
    # greedy decoding reproduces the counted tokens exactly (a needle's answer retrieved)
    misses: tuple[int, ...] | None = None
    # `Scorer.score_with_gradient` only: per window, d nll_j / d long_factor[i] for each pair i, then
    # d nll_j / d attention_factor (pairs + 1 values), where nll_j is that window's summed NLL as in `nll`
    gradient: tuple[tuple[float, ...], ...] | None = None

    @property
    def mean_nll(self) -> float:
        """NLL per token over all windows (NaN/inf stay as they are, for the caller to rank last)."""
        return sum(self.nll) / sum(self.tokens)

    @property
    def perplexity(self) -> float:
        return math.exp(self.mean_nll) if math.isfinite(self.mean_nll) else math.inf


def chunked_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head,
    *,
    chunk_tokens: int,
    logits: LogitTransform | None = None,
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL, argmax misses) per row of `hidden` [B, T, H] predicting `targets` [B, T], `chunk_tokens`
    positions at a time, counting only the positions where `loss_mask` [B, T] is True (all where None; misses
    are counted only with a mask). `logits` is what the model's family does to `lm_head`'s output before the loss
    (workers/families.py; None: nothing). Chunks with nothing to count are skipped, so a needle's loss (a few answer
    tokens) costs almost no lm_head work.

    Differentiable in `hidden`: when it carries autograd each chunk is checkpointed, so the backward recomputes
    one chunk's logits at a time instead of keeping every chunk's log-softmax (the [T, vocab] tensor the chunking
    exists to avoid) alive until the backward."""
    rows = hidden.shape[0]
    total = torch.zeros(rows, dtype=torch.float64, device=hidden.device)
    misses = torch.zeros(rows, dtype=torch.long, device=hidden.device)
    step = max(1, chunk_tokens // rows)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[1], step):
        chunk = slice(start, start + step)
        chunk_mask = None if loss_mask is None else loss_mask[:, chunk]
        if chunk_mask is not None and not bool(chunk_mask.any()):
            continue
        args = (hidden[:, chunk], targets[:, chunk], lm_head, logits, chunk_mask is not None)
        losses, wrong = checkpoint(chunk_losses, *args, use_reentrant=False) if recompute else chunk_losses(*args)
        if chunk_mask is not None:
            losses = torch.where(chunk_mask, losses, 0.0)  # a masked-out NaN must not reach the sum
            misses += (wrong & chunk_mask).sum(dim=1)
        total = total + losses.sum(dim=1)
        del losses, wrong  # free this chunk before the next one is computed, so only one exists at a time
    return total, misses


def chunk_losses(
    hidden: torch.Tensor, targets: torch.Tensor, lm_head, transform: LogitTransform | None, count_misses: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position NLL [B, n] (float64) of one chunk, and where the argmax misses the target (when asked).
    Logits go to float32 at least (a bfloat16 model's log-softmax in float32, as transformers' loss does; a
    float64 model's stay float64), then the family's scale and softcap apply, in that precision."""
    logits = lm_head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if transform is not None and transform.scale != 1.0:
        logits = logits * transform.scale
    if transform is not None and transform.softcap:
        logits = torch.tanh(logits / transform.softcap) * transform.softcap
    rows = hidden.shape[0]
    losses = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), reduction="none").view(rows, -1).double()
    wrong = logits.argmax(dim=-1) != targets if count_misses else None
    return losses, wrong


# The share of a GPU's free memory a gradient pass's checkpoints may take before they are kept on the host instead
# (`Scorer.checkpoint_home`; search/cost/memory.py prices the same rule)
CHECKPOINT_SHARE = 1 / 3
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
        mlp_chunk_tokens: int | None = DEFAULT_MLP_CHUNK_TOKENS,
        checkpoints: Literal["auto", "host", "device"] = "auto",
        loss_mask: torch.Tensor | None = None,
    ):
        """`loss_mask` [count, length - 1] bool: which predictions of each window count (None: all).
        `mlp_chunk_tokens`: tokens per chunk of each layer's MLP (workers/sequence_chunks.py; None: unchunked).
        `checkpoints`: where a gradient pass keeps its layer checkpoints (`checkpoint_home`)."""
        if windows.ndim != 2 or windows.shape[1] < 2:
            raise ValueError(f"windows: expected [count, length >= 2] token ids, got shape {tuple(windows.shape)}")
        expected = (windows.shape[0], windows.shape[1] - 1)
        if loss_mask is not None and tuple(loss_mask.shape) != expected:
            raise ValueError(f"loss_mask: expected shape {expected}, got {tuple(loss_mask.shape)}")
        self.model = model
        # the input embedding's device: a model spread over GPUs (workers/device_plan.py) takes its input ids on
        # the first one; on one device this is every parameter's device
        self.device = model.get_input_embeddings().weight.device
        self.windows = windows.to(self.device, dtype=torch.long)
        self.loss_mask = None if loss_mask is None else loss_mask.to(self.device, dtype=torch.bool)
        counts = (windows.shape[1] - 1,) * len(windows) if loss_mask is None else loss_mask.sum(dim=1).tolist()
        self.counted_tokens = tuple(int(count) for count in counts)
        self.original_inv_freq = original_inv_freq
        self.candidates_per_forward = max(1, candidates_per_forward)
        self.tokens_per_forward = tokens_per_forward or DEFAULT_TOKENS_PER_FORWARD[self.device.type == "cuda"]
        self.loss_chunk_tokens = loss_chunk_tokens
        self.mlp_chunk_tokens = mlp_chunk_tokens
        self.checkpoints = checkpoints
        self.decoder = decoder_of(model)
        self.logits = family_of(model.config.to_dict()).logit_transform(model.config)

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
        begin, end = self.window_range(windows)
        nll = torch.zeros(len(candidates), end - begin, dtype=torch.float64)
        misses = torch.zeros(len(candidates), end - begin, dtype=torch.long)
        rotary = patched_rotary(self.model, self.original_inv_freq)
        with chunked_mlps(self.model, self.mlp_chunk_tokens), rotary as patched:
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
        tokens = self.counted_tokens[begin:end]
        return [
            CandidateScore(
                nll=tuple(row.tolist()),
                tokens=tokens,
                misses=None if self.loss_mask is None else tuple(int(v) for v in missed),
            )
            for row, missed in zip(nll, misses, strict=True)
        ]

    def window_range(self, windows: tuple[int, int] | None) -> tuple[int, int]:
        """[start, stop) of the windows to score (None: all), refused when it is not within them."""
        begin, end = (0, len(self.windows)) if windows is None else windows
        if not 0 <= begin < end <= len(self.windows):
            raise ValueError(f"windows: expected 0 <= start < stop <= {len(self.windows)}, got [{begin}, {end})")
        return begin, end

    def score_with_gradient(self, method: RopeMethod, windows: tuple[int, int] | None = None) -> CandidateScore:
        """One LongRoPE candidate scored as `score([method], windows)` scores it, with `gradient`: per window,
        d nll / d long_factor[i] for every pair i, then d nll / d attention_factor.

        Only the long regime is differentiated (`check_differentiable`): long factors at every position, as
        transformers applies them when max position + 1 > original_max_position_embeddings. Each forward stacks
        the windows as `score` does for one candidate, every batch row with its own copy of the factors and
        attention factor (one [rows, pairs + 1] leaf), so the backward of the rows' summed NLL gives each row, i.e.
        each window, its own gradient in one pass. The weights stay frozen (`frozen_parameters`: no weight
        gradient is computed or stored) and each decoder layer is checkpointed (`checkpointed_layers`), so memory
        is the forward's plus one hidden state per layer, and the backward recomputes each layer's forward once."""
        begin, end = self.window_range(windows)
        self.check_differentiable(method)
        return_freed_memory()  # the backward's freed activations leave the process (workers/host_memory.py)
        pairs = method.rotary_dim // 2
        dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        values = torch.tensor([*method.long_factor, method.attention_factor], dtype=dtype, device=self.device)
        nll, misses, gradient = [], [], []
        per_forward = self.windows_per_forward(1, end - begin)
        with (
            gradient_mode(self.model, self.checkpoint_home(per_forward)),
            patched_rotary(self.model, self.original_inv_freq) as patched,
            chunked_mlps(self.model, self.mlp_chunk_tokens),  # the backward's recompute chunks as the forward did
        ):
            for start in range(begin, end, per_forward):
                stop = min(start + per_forward, end)
                leaf = values.repeat(stop - start, 1).requires_grad_()
                patched.set_long_factors(method, leaf[:, :pairs], leaf[:, pairs])
                mask = None if self.loss_mask is None else self.loss_mask[start:stop]
                rows_nll, rows_misses = self._batch_loss(self.windows[start:stop], mask)
                (rows_gradient,) = torch.autograd.grad(rows_nll.sum(), leaf)
                nll += rows_nll.detach().cpu().tolist()
                misses += rows_misses.cpu().tolist()
                gradient += rows_gradient.double().cpu().tolist()
        return CandidateScore(
            nll=tuple(nll),
            tokens=self.counted_tokens[begin:end],
            misses=None if self.loss_mask is None else tuple(int(v) for v in misses),
            gradient=tuple(tuple(row) for row in gradient),
        )

    def checkpoint_home(self, rows: int) -> torch.device | None:
        """Where a gradient pass keeps each layer's input (None: where the model is): the host with `checkpoints`
        "host"; with "auto", the host when the model is on a GPU and the checkpoints of a
        forward of `rows` windows (layers x rows x positions x hidden) would take more than `CHECKPOINT_SHARE` of
        its free memory: the rest holds the forward's activations and the backward's recomputed layer, which at long
        windows are each about the checkpoints' size. A model spread over GPUs is judged on its first GPU, against
        every layer's checkpoints (each GPU keeps only its own layers': cautious, as search/cost/memory.py prices)."""
        if self.checkpoints == "host":
            return torch.device("cpu")
        if self.checkpoints == "device" or self.device.type != "cuda":
            return None
        parameter = next(self.model.parameters())
        size = len(self.decoder.layers) * rows * self.context_length * self.model.config.hidden_size
        free, _ = torch.cuda.mem_get_info(self.device)
        return torch.device("cpu") if size * parameter.element_size() > free * CHECKPOINT_SHARE else None

    def check_differentiable(self, method: RopeMethod) -> None:
        """A ValueError naming why, unless `method` is a LongRope read in its long regime at this scorer's length
        with n_hat 0, on this model's pairs: the short regime's factors are not the searched ones, and n_hat moves
        positions between frequency sets (a step, not differentiable)."""
        if not isinstance(method, LongRope):
            raise ValueError(f"score_with_gradient: needs a LongRope method (its factors), got {type(method).__name__}")
        if method.n_hat:
            raise ValueError(f"score_with_gradient: n_hat = {method.n_hat} is not differentiable; needs n_hat 0")
        if not method.uses_long_factor(self.context_length):
            raise ValueError(
                f"score_with_gradient: windows of {self.context_length} positions are within the method's "
                f"original_max_position_embeddings ({method.original_max_position_embeddings}): the short regime, "
                "whose factors are not differentiated; only the long factors are"
            )
        if method.rotary_dim // 2 != self.original_inv_freq.numel():
            raise ValueError(
                f"score_with_gradient: the method has {method.rotary_dim // 2} pairs, the model "
                f"{self.original_inv_freq.numel()}"
            )

    def _batch_loss(self, batch: torch.Tensor, loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # use_cache=False: scoring never decodes on, and a DynamicCache would keep every layer's keys and values
        # alive to the end of the forward (16 GiB for a 7B model at 32k tokens)
        hidden = self.decoder(input_ids=batch[:, :-1], use_cache=False).last_hidden_state
        # spread over GPUs, the final hidden states, lm_head and so the logits are on the last device: the targets
        # and the mask go there (on one device every `.to` here returns its tensor as it is)
        head = self.model.lm_head.weight.device
        return chunked_loss(
            hidden.to(head),
            batch[:, 1:].to(head),
            self.model.lm_head,
            chunk_tokens=self.loss_chunk_tokens,
            logits=self.logits,
            loss_mask=None if loss_mask is None else loss_mask.to(head),
        )


@contextmanager
def gradient_mode(model, offload_to: torch.device | None = None) -> Iterator[None]:
    """What a gradient forward runs under: autograd on (even inside a caller's inference mode), the weights
    frozen, every decoder layer checkpointed (its input kept on `offload_to` when given: `checkpointed_layers`)."""
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        frozen_parameters(model),
        checkpointed_layers(model, offload_to),
    ):
        yield


@contextmanager
def frozen_parameters(model) -> Iterator[None]:
    """Every parameter with requires_grad False for the block, each restored after: autograd then computes no
    weight gradient (each matmul's backward is one matmul, for its input, not two) and no `.grad` is written."""
    flags = [(param, param.requires_grad) for param in model.parameters()]
    for param, _ in flags:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in flags:
            param.requires_grad_(flag)


@contextmanager
def checkpointed_layers(model, offload_to: torch.device | None = None) -> Iterator[None]:
    """Each layer of the model's decoder (`model.model.layers` in most families) runs under
    `torch.utils.checkpoint` (non-reentrant) for the block: the forward keeps only each layer's inputs (its hidden
    state; cos/sin are shared by all layers) and the backward recomputes the layer's activations one layer at a
    time. With `offload_to` (the host, for a GPU model) each layer's input is kept there instead, a copy, and
    brought back for the layer's recompute: an 8B model's 32 checkpoints at 128k tokens are 32 GiB of GPU memory
    otherwise (the copies are differentiable, so the gradient still reaches the input).

    The layer's instance `forward` is wrapped, not the class and not transformers' own switch
    (`gradient_checkpointing_enable` acts only in training mode, which would also turn dropout on: transformers 5.x
    modeling_layers.py `GradientCheckpointingLayer`); module hooks stay outside the checkpoint, as transformers
    keeps them."""
    with wrapped_forwards(decoder_of(model).layers, lambda forward: _checkpointed(forward, offload_to)):
        yield


def _checkpointed(forward, offload_to: torch.device | None = None):
    def run(*args, **kwargs):
        if offload_to is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        hidden, rest = (args[0], args[1:]) if args else (kwargs.pop("hidden_states"), ())
        device = hidden.device
        kept = hidden.to(offload_to, copy=True)  # the only copy the checkpoint holds; `hidden` can be freed

        def from_kept(kept, *rest, **kwargs):
            return forward(kept.to(device), *rest, **kwargs)

        return checkpoint(from_kept, kept, *rest, use_reentrant=False, **kwargs)

    return run
