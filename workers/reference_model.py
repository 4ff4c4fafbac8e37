"""The reference model: a small standard LlamaForCausalLM on bytes, trained by the project on the embedded corpus.

It lets the whole product run with no GPU and no download, and it shows the problem the product solves: trained
at 128 tokens, its perplexity at 8x that length with plain RoPE is several times its perplexity at 1x. A share of
its training windows carry a needle (`needles.py`: a hidden 7-digit number and a question asking for it), so it
can retrieve a number within its training length, and needle retrieval at 8x measures what the factors keep. The
checkpoint ships as package data (`reference_model/`); `longrope train-reference` is the recipe that made it,
nanoGPT-plain and deterministic under its seed. The demo and the tests never train it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from longrope.workers.byte_tokenizer import encode_bytes
from longrope.workers.corpus import Split, corpus_documents, corpus_provenance
from longrope.workers.needles import answer_mask, needle_windows
from longrope.workers.reference_recipe import TrainingRecipe
from longrope.workers.scorer import chunked_loss
from longrope.workers.suite_model import suite_config
from longrope.workers.training_loop import BYTES, train_steps


def reference_config(recipe: TrainingRecipe):
    """transformers' LlamaConfig of the recipe's shape (`suite_model.suite_config`, the shape the suite's `rope`
    checkpoint shares)."""
    return suite_config("rope", recipe).llama_config()


def split_tokens(split: Split) -> list[np.ndarray]:
    return [encode_bytes(doc.text) for doc in corpus_documents(split)]


@torch.no_grad()
def needle_retrieval(model, documents: list[np.ndarray], length: int, count: int = 64) -> dict[str, float]:
    """Exact-match accuracy and mean answer NLL of `count` held-out needle windows of `length` tokens, by the
    scorer's own rule (`scorer.chunked_loss`): a needle is retrieved when none of its answer tokens misses the
    argmax given the true prefix, which is exactly when greedy decoding returns the number."""
    needles, _, _ = needle_windows(documents, BYTES, length=length, count=count, seed=0)
    tokens = torch.from_numpy(np.stack([needle.tokens for needle in needles]))
    mask = torch.from_numpy(answer_mask(needles))
    hidden = model.model(input_ids=tokens[:, :-1]).last_hidden_state
    nll, misses = chunked_loss(hidden, tokens[:, 1:], model.lm_head, chunk_tokens=8192, loss_mask=mask)
    return {"accuracy": float((misses == 0).double().mean()), "answer_nll": float((nll / mask.sum(dim=1)).mean())}


@torch.no_grad()
def heldout_perplexity(model, documents: list[np.ndarray], length: int, span: int, max_documents: int = 64) -> float:
    """Perplexity of the first `span` tokens of up to `max_documents` held-out documents, cut into windows of
    `length` tokens. The same tokens for every `length`, so lengths compare by context alone."""
    spans = [doc[:span] for doc in documents if len(doc) >= span][:max_documents]
    if not spans:
        raise ValueError(f"no held-out document has {span} tokens")
    windows = torch.from_numpy(np.stack(spans)).reshape(-1, length)
    losses = [model(input_ids=chunk, labels=chunk).loss for chunk in windows.split(max(1, 8192 // length))]
    return math.exp(float(torch.stack(losses).mean()))


def train_reference(out_dir: Path, recipe: TrainingRecipe, *, log=print) -> dict:
    """Train the reference model and write config.json, model.safetensors and training.json to `out_dir`."""
    from transformers import LlamaForCausalLM  # transformers: only to train; reading the recipe needs none

    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    model = LlamaForCausalLM(reference_config(recipe))
    stream = np.concatenate(split_tokens("train"))
    test_needle_docs = split_tokens("test")

    def needle_check(step: int) -> None:
        model.eval()
        found = needle_retrieval(model, test_needle_docs, recipe.train_length, count=32)["accuracy"]
        model.train()
        log(f"step {step:5d}/{recipe.steps}  needle accuracy at {recipe.train_length}: {found:.2f}")

    started = time.monotonic()
    train_steps(
        model, lambda batch: model(input_ids=batch, labels=batch).loss, stream, recipe, log=log, checkpoint=needle_check
    )
    model.eval()
    test_docs = split_tokens("test")
    span = 8 * recipe.train_length
    metrics = {
        f"test_perplexity_at_{n}": heldout_perplexity(model, test_docs, n, span)
        for n in (recipe.train_length, 2 * recipe.train_length, span)
    }
    for n in (recipe.train_length, span):
        for name, value in needle_retrieval(model, test_docs, n).items():
            metrics[f"test_needle_{name}_at_{n}"] = value
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    summary = {
        "recipe": asdict(recipe),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.monotonic() - started, 1),
        "corpus": corpus_provenance(),
        "metrics": metrics,
    }
    (out_dir / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
