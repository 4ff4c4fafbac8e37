"""The suite's encodings on a trained model: the suite decoder, its training, and `longrope extrapolation`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.nn import functional
from transformers import LlamaForCausalLM

from longrope.encodings.absolute import LearnedAbsoluteEncoding, SinusoidalEncoding
from longrope.encodings.alibi import ALiBiEncoding
from longrope.encodings.baselines import baseline_methods
from longrope.encodings.cope import CoPEEncoding
from longrope.encodings.interface import NoPE, PositionalEncoding, RotaryEncoding
from longrope.encodings.rope_methods import LongRope
from longrope.search.cli.main import main
from longrope.search.reports.extrapolation import (
    MULTIPLES,
    ExtrapolationCell,
    Row,
    cell_of,
    document_nll,
    evaluation_tokens,
    markdown_table,
)
from longrope.workers.reference_recipe import ENCODING_NAMES, TrainingRecipe
from longrope.workers.suite_model import SuiteDecoder, SuiteModelConfig, suite_config
from longrope.workers.suite_training import load_suite_model, suite_model_dir, train_suite_model

SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_layers": 2, "num_heads": 2, "head_dim": 32}
TINY_RECIPE = TrainingRecipe(
    steps=40, warmup_steps=5, batch_size=8, train_length=32, hidden_size=32, num_layers=1, num_heads=2, head_dim=16,
    intermediate_size=64, needle_share=0.0,
)  # fmt: skip
# (encoding, the suite class its checkpoint must use, where it sits, the hook the forward must call)
SUITE_MODULES = {
    "sinusoidal": (SinusoidalEncoding, "embeddings", "add_to_embeddings"),
    "learned": (LearnedAbsoluteEncoding, "embeddings", "add_to_embeddings"),
    "alibi": (ALiBiEncoding, "attention", "attention_bias"),
    "cope": (CoPEEncoding, "attention", "attention_bias"),
    "nope": (NoPE, "attention", "attention_bias"),
    "rope": (RotaryEncoding, "attention", "rotate"),
}


def llama_twin(model: SuiteDecoder, rope_parameters: dict, max_position_embeddings: int) -> LlamaForCausalLM:
    """transformers' Llama with the suite decoder's weights and the given rope_parameters."""
    twin = LlamaForCausalLM(model.config.llama_config(rope_parameters, max_position_embeddings)).eval()
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to embed_tokens
    return twin


def random_rope_model(train_length: int = 64) -> SuiteDecoder:
    torch.manual_seed(0)
    return SuiteDecoder(SuiteModelConfig(encoding="rope", train_length=train_length, **SHAPE)).eval()


def test_rope_suite_decoder_is_transformers_llama():
    model = random_rope_model()
    twin = llama_twin(model, {"rope_type": "default", "rope_theta": 10000.0}, 64)
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), twin(input_ids=ids).logits, atol=2e-5, rtol=1e-4)
        labels_loss = twin(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(model.loss(ids), labels_loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["pi", "ntk", "dynamic", "yarn", "llama3", "longrope"])
def test_rope_model_read_with_an_extension_is_transformers_with_that_rope_type(name):
    """The extrapolation benchmark's RoPE rows: the suite decoder with a method = transformers' Llama configured
    with that method's rope_parameters, at 4x the training length."""
    model = random_rope_model()
    methods = baseline_methods(head_dim=32, rope_theta=10000.0, partial_rotary_factor=1.0, original=64, target=256)
    methods["longrope"] = LongRope.from_factors(
        torch.linspace(1.0, 6.0, 16), head_dim=32, original_length=64, target_length=256, attention_factor=1.2
    )
    method = methods[name]
    model.use_rope_method(method)
    twin = llama_twin(model, method.to_hf(), method.max_position_embeddings)
    ids = torch.randint(0, 256, (1, 256), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), twin(input_ids=ids).logits, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ENCODING_NAMES)
def test_each_encoding_trains_and_its_loss_drops(name, tmp_path):
    summary = train_suite_model(tmp_path, name, TINY_RECIPE, log=lambda line: None)
    losses = np.array(summary.losses)
    assert len(losses) == TINY_RECIPE.steps
    assert losses[-5:].mean() < losses[:5].mean() - 0.5, losses
    reloaded = load_suite_model(tmp_path)
    assert reloaded.config.encoding == name
    assert json.loads((tmp_path / "training.json").read_text())["encoding"] == name


def test_suite_training_is_deterministic(tmp_path):
    recipe = TrainingRecipe(**{**TINY_RECIPE.__dict__, "steps": 6})
    first = train_suite_model(tmp_path / "a", "cope", recipe, log=lambda line: None)
    second = train_suite_model(tmp_path / "b", "cope", recipe, log=lambda line: None)
    assert first.losses == second.losses
    a, b = load_suite_model(tmp_path / "a").state_dict(), load_suite_model(tmp_path / "b").state_dict()
    assert all(torch.equal(a[key], b[key]) for key in a)


def test_learned_table_is_the_training_length_and_other_encodings_add_no_positions():
    config = SuiteModelConfig(encoding="learned", train_length=48, **SHAPE)
    model = SuiteDecoder(config)
    assert model.model.position.table.weight.shape == (48, SHAPE["hidden_size"])
    models = {name: SuiteDecoder(SuiteModelConfig(encoding=name, train_length=48, **SHAPE)) for name in ENCODING_NAMES}
    sizes = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    assert sizes["sinusoidal"] == sizes["alibi"] == sizes["nope"] == sizes["rope"]
    assert sizes["learned"] - sizes["rope"] == 48 * SHAPE["hidden_size"]
    assert sizes["cope"] - sizes["rope"] == SHAPE["num_layers"] * SHAPE["head_dim"] * 49  # one table per layer


def _encoding_modules(model: SuiteDecoder, place: str) -> list[PositionalEncoding]:
    return [model.model.position] if place == "embeddings" else model.attention_encodings()


@pytest.mark.parametrize("name", ENCODING_NAMES)
def test_each_shipped_checkpoint_forwards_through_the_suite_module(name, monkeypatch):
    """The shipped checkpoint holds the suite's own class for its encoding, its forward calls that class's hook
    once per place, and its output depends on the hook (replacing the hook with the identity changes it)."""
    directory = suite_model_dir(name)
    assert (directory / "model.safetensors").stat().st_size <= 4 * 2**20
    model = load_suite_model(directory)
    suite_class, place, hook = SUITE_MODULES[name]
    modules = _encoding_modules(model, place)
    assert modules and all(type(module) is suite_class for module in modules)
    elsewhere = _encoding_modules(model, "attention" if place == "embeddings" else "embeddings")
    assert all(type(module) is NoPE for module in elsewhere)  # position enters in one place only
    ids = torch.from_numpy(evaluation_tokens(model.config.train_length, 1, 1)[:, :-1])
    calls = []
    original = getattr(suite_class, hook)

    def counted(self, *args):
        calls.append(self)
        return original(self, *args)

    with torch.no_grad():
        reference = model(ids)
        monkeypatch.setattr(suite_class, hook, counted)
        torch.testing.assert_close(model(ids), reference, atol=0, rtol=0)
        assert [id(m) for m in calls if m in modules] == [id(m) for m in modules]
        if name != "nope":  # NoPE's hooks are the identity by definition
            monkeypatch.setattr(suite_class, hook, getattr(PositionalEncoding, hook))
            assert not torch.allclose(model(ids), reference, atol=1e-3)


def test_learned_past_its_table_cannot_run():
    model = load_suite_model(suite_model_dir("learned"))
    tokens = evaluation_tokens(model.config.train_length, 2, 2)
    inside = cell_of(model, Row("learned", "none"), tokens, model.config.train_length, 1)
    past = cell_of(model, Row("learned", "none"), tokens, model.config.train_length, 2)
    assert inside.perplexity is not None and inside.reason is None
    assert past.perplexity is None and past.low is None and past.high is None
    assert past.reason.startswith("cannot run: learned absolute positions cover 0..127; got position 255")


def _transformers_loss(model: LlamaForCausalLM, window: np.ndarray) -> float:
    ids = torch.from_numpy(window)
    return float(model(input_ids=ids, labels=ids).loss)


def test_document_nll_is_transformers_loss_on_the_same_windows():
    """A second formulation: transformers' own loss (labels=...) on each window, averaged per document."""
    model = load_suite_model(suite_model_dir("rope"))
    twin = llama_twin(model, {"rope_type": "default", "rope_theta": 10000.0}, 128)
    tokens = evaluation_tokens(128, 2, 2)  # 2 documents of 257 tokens
    for length in (128, 256):
        ours = document_nll(model, tokens, length)
        windows = [tokens[:, k * length : (k + 1) * length + 1] for k in range(256 // length)]
        with torch.no_grad():
            theirs = [np.mean([_transformers_loss(twin, w[d : d + 1]) for w in windows]) for d in range(2)]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_evaluation_predicts_the_same_tokens_at_every_length():
    """Whatever the window length, the model is fed each document's first span tokens (so it predicts the span
    tokens after the first), in windows that continue one another."""
    tokens = evaluation_tokens(128, 3)
    span = 128 * MULTIPLES[-1]
    assert tokens.shape == (3, span + 1)
    fed = []

    class Recorder(torch.nn.Module):
        def forward(self, ids):
            fed.append(ids.clone())
            return functional.one_hot(ids, 256).float()

    for length in (128, 512, span):
        fed.clear()
        nll = document_nll(Recorder(), tokens, length)
        rows = torch.cat(fed).reshape(3, span // length, length)
        assert rows.shape[-1] == length and len(nll) == 3
        torch.testing.assert_close(rows.flatten(1), torch.from_numpy(tokens[:, :span]))


@pytest.mark.slow
def test_extrapolation_cli_writes_every_cell(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["extrapolation", "-o", str(out), "--documents", "2"]) == 0
    cells = json.loads((out / "extrapolation.json").read_text())
    keys = {(c["encoding"], c["method"], c["length"]) for c in cells}
    lengths = [128 * m for m in MULTIPLES]
    expected = {(e, "none", n) for e in ENCODING_NAMES for n in lengths}
    expected |= {("rope", m, n) for m in ("pi", "ntk", "dynamic", "yarn", "llama3", "longrope") for n in lengths}
    assert keys == expected and len(cells) == len(expected)
    for cell in cells:
        assert cell["multiple"] * 128 == cell["length"] and cell["documents"] == 2
        if cell["encoding"] == "learned" and cell["length"] > 128:
            assert cell["perplexity"] is None and cell["reason"].startswith("cannot run")
        else:
            assert cell["low"] <= cell["perplexity"] <= cell["high"] and cell["reason"] is None
    plain = {c["length"]: c["perplexity"] for c in cells if (c["encoding"], c["method"]) == ("rope", "none")}
    assert plain[2048] > 2 * plain[128]  # plain RoPE does not extrapolate
    assert (out / "extrapolation.png").stat().st_size > 10_000
    table = (out / "extrapolation.md").read_text()
    assert "| learned | 无 none |" in table and table.count("cannot run") == 4
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoints", "{t}/missing"], "--checkpoints {t}/missing: no such directory"),
        (["--checkpoints", "{t}"], "--checkpoints {t}: holds none of sinusoidal/config.json"),
        (["--documents", "1"], "--documents: needs at least 2 for an interval, got 1"),
        (["--factors", "{t}/f.json"], "factors file '{t}/f.json': no such file"),
        (["--device", "bogus"], "--device bogus: torch cannot use it here"),
    ],
)
def test_extrapolation_bad_input_is_one_line(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    argv = ["extrapolation", "-o", str(out), *[a.format(t=tmp_path) for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(t=tmp_path) in err[0]
    assert not out.exists()


def test_extrapolation_refuses_factors_of_another_model(tmp_path, capsys):
    factors = tmp_path / "f.json"
    assert main(["encodings", "factors", "yarn", "--factor", "4", "--original-length", "64", "--head-dim", "32"]) == 0
    factors.write_text(capsys.readouterr().out)
    assert main(["extrapolation", "-o", str(tmp_path / "out"), "--factors", str(factors), "--documents", "2"]) == 2
    err = capsys.readouterr().err
    assert "original_max_position_embeddings is 64, but the rope model was trained at 128" in err


def test_sinusoidal_model_adds_the_papers_table_to_scaled_embeddings():
    """Vaswani et al. sec. 3.4/3.5 worked by hand: layer 0 reads sqrt(d) * E[token] + PE[p], with
    PE[p, 2k] = sin(p / 10000^(2k/d)) and PE[p, 2k+1] = cos(p / 10000^(2k/d))."""
    recipe = TrainingRecipe(hidden_size=16, head_dim=8, num_heads=2, num_layers=1, intermediate_size=32)
    model = SuiteDecoder(suite_config("sinusoidal", recipe)).eval()
    assert suite_config("rope", recipe).embedding_scale == 1.0
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.tensor([[3, 7, 250, 9]])
    with torch.no_grad():
        model(ids)
    expected = 4.0 * model.model.embed_tokens.weight[ids[0]].clone()
    for p in range(4):
        for k in range(8):
            angle = p / 10000 ** (2 * k / 16)
            expected[p, 2 * k] += np.sin(angle)
            expected[p, 2 * k + 1] += np.cos(angle)
    torch.testing.assert_close(seen[0][0], expected, atol=1e-6, rtol=1e-6)


def test_cli_trains_exactly_the_suite_encodings():
    from longrope.search.cli.main import build_parser

    parser = build_parser()
    for name in ENCODING_NAMES:
        assert parser.parse_args(["train-reference", "--out", "x", "--encoding", name]).encoding == name
    with pytest.raises(SystemExit):
        parser.parse_args(["train-reference", "--out", "x", "--encoding", "mrope"])


def test_table_bolds_every_best_as_printed_and_marks_cells_that_cannot_run():
    def cell(encoding, method, multiple, ppl):
        bounds = {} if ppl is None else {"low": ppl * 0.9, "high": ppl * 1.1}
        return ExtrapolationCell(
            encoding=encoding, method=method, length=128 * multiple, multiple=multiple, perplexity=ppl,
            low=bounds.get("low"), high=bounds.get("high"), documents=4,
        )  # fmt: skip

    cells = [
        cell("learned", "none", 1, 5.0), cell("learned", "none", 2, None),
        cell("rope", "none", 1, 4.0001), cell("rope", "none", 2, 9.0),
        cell("rope", "yarn", 1, 4.0002), cell("rope", "yarn", 2, 4.5),
    ]  # fmt: skip
    lines = markdown_table(cells).splitlines()
    assert lines[2] == "| learned | 无 none | 5.000 [4.500, 5.500] | cannot run | — |"
    assert lines[3] == "| rope | medium | **4.000** [3.600, 4.400] | 9.000 [8.100, 9.900] | 2.25x |"
    assert lines[4] == "| rope + yarn | 很好 very good | **4.000** [3.600, 4.400] | **4.500** [4.050, 4.950] | 1.12x |"


def test_a_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    rope = tmp_path / "ck" / "rope"
    rope.mkdir(parents=True)
    (rope / "config.json").write_text((suite_model_dir("rope") / "config.json").read_text())
    (rope / "model.safetensors").write_bytes(b"\xff" * 64)
    argv = ["extrapolation", "-o", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "ck")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a suite checkpoint" in err[0] and str(rope) in err[0]
    assert not (tmp_path / "out").exists()
