"""Objectives: needle windows (bytes and a real BPE tokenizer), tail and needle loss masks checked against
transformers' own loss with ignored labels, exact-match retrieval against `generate`, and the objective mix."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from longrope.encodings import RopeMethod
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.reports.intervals import wilson_interval
from longrope.workers.corpus import corpus_documents
from longrope.workers.documents import read_source
from longrope.workers.errors import DataError
from longrope.workers.needles import KEY_SENTENCE, depth_spread, make_needle, needle_windows
from longrope.workers.scorer import Scorer
from longrope.workers.tokenization import TextTokenizer
from longrope.workers.windows import interleave_windows, load_windows

BYTES = TextTokenizer("bytes")
IGNORE = -100  # transformers' ignore_index for labels


@pytest.fixture(scope="module")
def search_docs() -> list[np.ndarray]:
    return [BYTES.encode(doc.text) for doc in corpus_documents("search")]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A small BPE tokenizer trained with the `tokenizers` library and saved as a model's tokenizer would be."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"], show_progress=False)
    tokenizer.train_from_iterator((doc.text for doc in corpus_documents("train")[:200]), trainer)
    folder = tmp_path_factory.mktemp("bpe")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", clean_up_tokenization_spaces=False)
    fast.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("tokenizer_kind", ["bytes", "bpe"])
def test_needle_window_is_exact_length_ends_in_the_answer_and_hides_the_number_at_a_break(
    tokenizer_kind, search_docs, bpe_dir
):
    tokenizer = BYTES if tokenizer_kind == "bytes" else TextTokenizer(bpe_dir)
    docs = search_docs if tokenizer_kind == "bytes" else [tokenizer.encode(d.text) for d in corpus_documents("search")]
    needles, _, _ = needle_windows(docs, tokenizer, length=400, count=5, seed=3)
    assert [n.depth for n in needles] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len({n.number for n in needles}) == 5
    for needle in needles:
        assert needle.tokens.shape == (400,)
        # the answer's tokens are the number's tokens inside the key sentence (a BPE splits both alike)
        answer = needle.tokens[needle.answer_start :].tolist()
        key_tokens = needle.tokens[needle.key_start : needle.answer_start].tolist()
        assert any(key_tokens[i : i + len(answer)] == answer for i in range(len(key_tokens)))
        assert tokenizer.decode(needle.tokens[needle.answer_start :]) == " " + needle.number
        assert len(needle.number) == 7
        text = tokenizer.decode(needle.tokens)
        assert text.count(needle.number) == 2  # once hidden, once as the answer
        key = tokenizer.decode(needle.tokens[needle.key_start :])
        assert key.startswith(KEY_SENTENCE.format(number=needle.number))
        last_before = tokenizer.decode(needle.tokens[needle.key_start - 1 : needle.key_start])
        assert "\n" in last_before  # inserted after a token holding a line break


def test_needle_goes_to_the_break_nearest_its_depth():
    """Hand-made haystack: breaks after tokens 9, 29 and 79 of 100; depth 0.35 (token 35) picks the one at 30."""
    haystack = np.full(200, ord("a"), dtype=np.int64)
    haystack[[9, 29, 79]] = ord("\n")
    room = 100
    length = room + sum(
        len(BYTES.encode(piece))
        for piece in ("A number is hidden in this text.\n", KEY_SENTENCE.format(number="1234567"))
    )
    length += len(BYTES.encode("\nWhat is the number? The number is 1234567"))
    needle = make_needle(haystack, BYTES, length=length, depth=0.35, number="1234567")
    preamble = len(BYTES.encode("A number is hidden in this text.\n"))
    assert needle.key_start == preamble + 30


def test_a_needle_that_cannot_fit_the_window_is_one_clear_error(search_docs):
    with pytest.raises(DataError, match=r"needle needs .* tokens"):
        needle_windows(search_docs, BYTES, length=60, count=2, seed=0)


def test_depths_spread_over_the_window():
    assert depth_spread(1) == [0.5]
    assert depth_spread(3) == [0.0, 0.5, 1.0]


def _hf_masked_loss(model, tokens: np.ndarray, mask: np.ndarray) -> float:
    """transformers' own mean loss with every uncounted label set to the ignore index."""
    ids = torch.from_numpy(tokens)[None]
    labels = ids.clone()
    labels[0, 1:][~torch.from_numpy(mask)] = IGNORE
    labels[0, 0] = IGNORE
    with torch.no_grad():
        return float(model(input_ids=ids, labels=labels).loss)


@pytest.mark.parametrize("objective", ["needle", "tail"])
def test_masked_scores_equal_transformers_loss_with_ignored_labels(objective, reference_model, tmp_path):
    model, rope = reference_model
    windows = load_windows(
        read_source("corpus:search"),
        BYTES,
        length=257,
        count=3,
        seed=1,
        objective=objective,
        original_length=128,
        cache_dir=tmp_path,
    )
    plain = RopeMethod(head_dim=32, max_position_embeddings=256)
    scorer = Scorer(
        model,
        torch.from_numpy(windows.tokens),
        rope.method.original_inv_freq(),
        loss_mask=torch.from_numpy(windows.loss_mask),
        loss_chunk_tokens=64,  # several chunks, some with nothing to count
    )
    score = scorer.score([plain])[0]
    assert score.tokens == tuple(int(m.sum()) for m in windows.loss_mask)
    if objective == "tail":
        assert score.tokens == (256 - 128,) * 3
    for j in range(3):
        expected = _hf_masked_loss(model, windows.tokens[j], windows.loss_mask[j])
        assert score.nll[j] / score.tokens[j] == pytest.approx(expected, rel=1e-4)


def test_zero_misses_is_exactly_greedy_decoding_returning_the_number(reference_model, search_docs):
    model, rope = reference_model
    needles, _, _ = needle_windows(search_docs, BYTES, length=129, count=12, seed=5)
    tokens = np.stack([n.tokens for n in needles])
    mask = np.zeros((12, 128), dtype=bool)
    for row, needle in enumerate(needles):
        mask[row, needle.answer_start - 1 :] = True
    scorer = Scorer(model, torch.from_numpy(tokens), rope.method.original_inv_freq(), loss_mask=torch.from_numpy(mask))
    score = scorer.score([RopeMethod(head_dim=32, max_position_embeddings=128)])[0]
    for needle, missed in zip(needles, score.misses, strict=True):
        prompt = torch.from_numpy(needle.tokens[: needle.answer_start])[None]
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
        retrieved = BYTES.decode(out[0, prompt.shape[1] :].numpy()) == " " + needle.number
        assert retrieved == (missed == 0)


def test_windows_cache_keeps_masks_and_keys_each_objective_apart(tmp_path):
    docs = read_source("corpus:search")
    made = {
        objective: load_windows(
            docs, BYTES, length=257, count=2, seed=0, objective=objective, original_length=128, cache_dir=tmp_path
        )
        for objective in ("perplexity", "tail", "needle")
    }
    assert len(list(tmp_path.glob("windows-*.npz"))) == 3
    for objective, windows in made.items():
        again = load_windows(
            docs, BYTES, length=257, count=2, seed=0, objective=objective, original_length=128, cache_dir=tmp_path
        )
        np.testing.assert_array_equal(again.tokens, windows.tokens)
        np.testing.assert_array_equal(again.mask_or_all(), windows.mask_or_all())
        assert again.window_objectives == (objective, objective)
        assert again.content_hash == windows.content_hash
    np.testing.assert_array_equal(made["tail"].tokens, made["perplexity"].tokens)
    assert made["tail"].content_hash != made["perplexity"].content_hash
    mixed = interleave_windows([made["perplexity"], made["needle"]])
    assert mixed.window_objectives == ("perplexity", "needle", "perplexity", "needle")
    np.testing.assert_array_equal(mixed.tokens[1::2], made["needle"].tokens)
    assert mixed.loss_mask[::2].all() and mixed.loss_mask[1::2].sum() == made["needle"].loss_mask.sum()


def test_objective_mix_weighs_each_objective_by_its_weight_not_its_tokens():
    mix = ObjectiveMix.of({"perplexity": 3.0, "needle": 1.0}, 2)
    assert mix.objectives == ("perplexity", "needle", "perplexity", "needle")
    nll, tokens = [100.0, 14.0, 300.0, 7.0], [100, 7, 100, 7]
    perplexity_mean, needle_mean = 400.0 / 200, 21.0 / 14
    assert mix.mean_nll(nll, tokens) == pytest.approx((3 * perplexity_mean + 1 * needle_mean) / 4)
    assert ObjectiveMix.single(4).mean_nll(nll, tokens) == pytest.approx(sum(nll) / sum(tokens))
    assert math.isnan(mix.mean_nll([math.nan, 1.0, 1.0, 1.0], tokens))
    assert mix.describe() == "0.75 perplexity + 0.25 needle"


def test_wilson_interval_by_hand():
    """0 of 10: [0, z^2 / (n + z^2)]; 5 of 10: 0.5 +- z sqrt(2.5 + z^2/4) / (10 + z^2)."""
    z = 1.959963984540054
    assert wilson_interval(0, 10) == (0.0, 0.0, pytest.approx(z * z / (10 + z * z)))
    share, low, high = wilson_interval(5, 10)
    half = z * math.sqrt(2.5 + z * z / 4) / (10 + z * z)
    assert (share, low, high) == (0.5, pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert wilson_interval(10, 10)[2] == 1.0


def test_racing_a_mix_weighs_each_window_by_its_objective():
    """Worse by 0.02 nats on perplexity windows, better by 1.0 on needle windows, weights 1:1: the mix says
    better (-0.49), so racing must not stop it; unweighted perplexity-first racing did (seen in review)."""
    from longrope.search.config.search_section import RacingConfig
    from longrope.search.run.racing import clearly_worse

    mix = ObjectiveMix.of({"perplexity": 1.0, "needle": 1.0}, 4)
    assert mix.racing_weights() == [1.0] * 8
    parent = [3.0, 2.5, 3.1, 2.4, 2.9, 2.6, 3.0, 2.5]
    child = [v + (0.02 if kind == "perplexity" else -1.0) for v, kind in zip(parent, mix.objectives, strict=True)]
    racing = RacingConfig(enabled=True, z=2.0, min_windows=3)
    ones = [1] * 8
    assert not clearly_worse(child[:4], ones[:4], parent, ones, racing, mix.racing_weights())
    heavy = ObjectiveMix.of({"perplexity": 9.0, "needle": 1.0}, 4)
    assert heavy.racing_weights()[:2] == [pytest.approx(1.8), pytest.approx(0.2)]
