"""`longrope export RUN --gguf IN.gguf -o OUT.gguf`: the copy holds rope_freqs.weight = the
run's long factors, llama.rope.scaling.attn_factor = its attention factor, llama.context_length = its target length
and the factors file as provenance; every other key and tensor (a quantized one too) is IN's, and IN is never
touched. Each input llama.cpp would not apply the tensor to is refused in one line, exit 2, nothing written.

The tiny GGUF itself is checked against transformers' own GGUF loader (which undoes llama.cpp's q/k permutation)
and our converter (workers/gguf_model.py): both read back the random model's weights exactly.
The tests marked `llama_cpp` (llama.cpp's own logits) are in test_llama_cpp.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from cli_checks import cli_error_line
from search_helpers import known_problem_run
from tiny_gguf import fields, rewritten_gguf, tensors, tiny_gguf, tiny_llama

from longrope.encodings import from_hf
from longrope.search.cli.main import main
from longrope.search.config.factors_file import read_factors_file
from longrope.search.export.factors_export import ExportError
from longrope.search.export.gguf_export import PROVENANCE_KEY, ROPE_FREQS, write_gguf_export
from longrope.search.export.llama_cpp_row import llama_cpp_row
from longrope.search.export.llama_gguf import permute_rows, write_llama_gguf

F32, Q8_0 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
SET_KEYS = {"llama.context_length", "llama.rope.scaling.attn_factor", PROVENANCE_KEY}


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run_and_factors(tmp_path_factory):
    """A finished cheap run (16 pairs, L0 64, target 256, theta 10000) and its JSON export."""
    folder = tmp_path_factory.mktemp("gguf-run")
    run = known_problem_run(folder / "run")
    assert main(["export", str(run), "-o", str(folder / "factors.json")]) == 0
    return run, read_factors_file(folder / "factors.json")


# ---- the tiny GGUF is a llama.cpp conversion of its model ----


def test_transformers_gguf_loader_reads_the_tiny_gguf_back_exactly(tmp_path):
    from transformers import AutoModelForCausalLM

    path, model = tiny_gguf(tmp_path / "tiny.gguf")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name)
    theirs, ours = loaded.state_dict(), model.state_dict()
    assert set(theirs) == set(ours)
    for name, value in ours.items():
        torch.testing.assert_close(theirs[name], value, rtol=0, atol=0, msg=name)
    assert loaded.config.num_key_value_heads == 1 and loaded.config.head_dim == 32
    # the file holds q/k in llama.cpp's order (adjacent pairs), which the loader undid: not transformers' own rows
    q = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    hf_q = ours["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert not np.array_equal(np.asarray(q.data), hf_q)
    np.testing.assert_array_equal(np.asarray(q.data), permute_rows(hf_q, 2))


def test_our_converter_reads_the_tiny_gguf_back_exactly(tmp_path):
    from safetensors.torch import load_file

    from longrope.workers.gguf_model import convert_gguf

    path, model = tiny_gguf(tmp_path / "tiny.gguf")
    convert_gguf(path, tmp_path / "hf", where="test")
    theirs = load_file(tmp_path / "hf" / "model.safetensors")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(theirs[name].float(), value, rtol=0, atol=0, msg=name)


# ---- the export ----


def test_export_gguf_writes_the_factors_and_copies_everything_else(run_and_factors, tmp_path, capsys):
    run, factors = run_and_factors
    source = tiny_gguf(tmp_path / "in.gguf")[0]
    source = rewritten_gguf(
        source, tmp_path / "q8.gguf", quantize={"token_embd.weight": gguf.GGMLQuantizationType.Q8_0}
    )
    before, mtime = digest(source), os.stat(source).st_mtime_ns
    out = tmp_path / "out.gguf"
    assert main(["export", str(run), "--gguf", str(source), "-o", str(out)]) == 0
    assert f"export: wrote {out}: {source} with {ROPE_FREQS}" in capsys.readouterr().err
    assert digest(source) == before and os.stat(source).st_mtime_ns == mtime  # IN untouched

    block = factors.rope_parameters
    written, original = tensors(out), tensors(source)
    rope_type, rope_shape, rope_bytes = written.pop(ROPE_FREQS)
    assert rope_type == F32 and rope_shape == (len(block.long_factor),)
    np.testing.assert_array_equal(np.frombuffer(rope_bytes, np.float32), np.float32(block.long_factor))
    assert written == original  # every other tensor: name, ggml type, shape, bytes
    assert original["token_embd.weight"][0] == Q8_0

    keys, original_keys = fields(out), fields(source)
    assert {name: keys[name] for name in original_keys if name not in SET_KEYS} == {
        name: value for name, value in original_keys.items() if name not in SET_KEYS
    }
    assert set(keys) - set(original_keys) == SET_KEYS - {"llama.context_length"}
    assert keys["llama.context_length"] == (original_keys["llama.context_length"][0], factors.max_position_embeddings)
    attn_types, attn = keys["llama.rope.scaling.attn_factor"]
    assert attn_types == (gguf.GGUFValueType.FLOAT32,) and attn == pytest.approx(block.attention_factor, rel=1e-7)
    assert json.loads(keys[PROVENANCE_KEY][1]) == factors.model_dump(mode="json", exclude_none=True)


def test_export_gguf_replaces_an_existing_output_through_its_link(run_and_factors, tmp_path):
    run, _ = run_and_factors
    source = tiny_gguf(tmp_path / "in.gguf")[0]
    (tmp_path / "old.gguf").write_bytes(b"old")
    (tmp_path / "link.gguf").symlink_to("old.gguf")
    assert main(["export", str(run), "--gguf", str(source), "-o", str(tmp_path / "link.gguf")]) == 0
    assert (tmp_path / "link.gguf").is_symlink() and ROPE_FREQS in tensors(tmp_path / "old.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf", "link.gguf", "old.gguf"]  # no temp file left


# ---- bad input: one line, exit 2, nothing written ----


def variant(t: Path, **changes) -> Path:
    return rewritten_gguf(tiny_gguf(t / "plain.gguf")[0], t / "in.gguf", **changes)


def truncated(t: Path, keep: int) -> Path:
    """The tiny GGUF cut to `keep` bytes (negative: that many bytes short)."""
    data = tiny_gguf(t / "in.gguf")[0].read_bytes()
    (t / "in.gguf").write_bytes(data[:keep])
    return t / "in.gguf"


def shaped(t: Path, **shape) -> Path:
    return tiny_gguf(t / "in.gguf", **shape)[0]


STRING, FLOAT32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.FLOAT32
BAD_INPUTS = [
    pytest.param(lambda t: t / "none.gguf", "--gguf '{t}/none.gguf': no such file", id="missing"),
    pytest.param(
        lambda t: (t / "in.gguf", (t / "in.gguf").write_text("not a model"))[0],
        "--gguf '{t}/in.gguf': not a GGUF file (it does not start with 'GGUF')",
        id="not-gguf",
    ),
    pytest.param(
        lambda t: truncated(t, -1000),
        "--gguf '{t}/in.gguf': not a whole GGUF file: truncated or damaged (cannot reshape",
        id="truncated-data",
    ),
    pytest.param(
        lambda t: truncated(t, 100),
        "--gguf '{t}/in.gguf': not a whole GGUF file: truncated or damaged (",
        id="truncated-header",
    ),
    pytest.param(
        lambda t: variant(t, architecture="phi3"),
        "--gguf '{t}/in.gguf': general.architecture is 'phi3'; only 'llama' GGUF files are exported",
        id="phi3",
    ),
    pytest.param(  # the reason is llama.cpp's own gemma3 graph's (search/export/gguf_export.py ARCHITECTURE_REFUSALS)
        lambda t: variant(t, architecture="gemma3"),
        "--gguf '{t}/in.gguf': general.architecture is 'gemma3': llama.cpp's gemma3 graph (src/models/gemma3.cpp) has "
        "no per-pair rope factors",
        id="gemma3",
    ),
    pytest.param(
        lambda t: variant(t, extra_tensors={ROPE_FREQS: np.ones(16, np.float32)}),
        f"--gguf '{{t}}/in.gguf': already has {ROPE_FREQS} (rescaled frequencies, as Llama 3.1's)",
        id="has-rope-freqs",
    ),
    pytest.param(
        lambda t: variant(t, set_keys={"llama.rope.scaling.type": ("yarn", STRING)}),
        "--gguf '{t}/in.gguf': llama.rope.scaling.type is 'yarn'; llama.cpp would scale its RoPE that way as well",
        id="yarn-scaling",
    ),
    pytest.param(
        lambda t: variant(t, set_keys={"llama.rope.scaling.type": ("longrope", STRING)}),
        "(and with 'longrope' would not read rope_freqs at all)",
        id="longrope-scaling",
    ),
    pytest.param(
        lambda t: variant(t, set_keys={"llama.rope.scaling.factor": (4.0, FLOAT32)}),
        "--gguf '{t}/in.gguf': llama.rope.scaling.factor is 4; llama.cpp multiplies every angle by its inverse",
        id="linear-factor",
    ),
    pytest.param(
        lambda t: shaped(t, head_dim=64),
        "--gguf '{t}/in.gguf': llama.rope.dimension_count gives 32 rotary pairs, the factors are for 16",
        id="other-head-dim",
    ),
    pytest.param(
        lambda t: shaped(t, rope_theta=500000.0),
        "--gguf '{t}/in.gguf': llama.rope.freq_base is 500000, the factors' rope_theta is 10000",
        id="other-rope-theta",
    ),
    pytest.param(
        lambda t: shaped(t, original=128),
        "--gguf '{t}/in.gguf': llama.context_length is 128, the factors' original length is 64",
        id="other-original-length",
    ),
]


@pytest.mark.parametrize(("make", "message"), BAD_INPUTS)
def test_bad_gguf_inputs_are_one_line(make, message, run_and_factors, tmp_path, capsys, caplog):
    run, _ = run_and_factors
    source = make(tmp_path)
    args = ["export", str(run), "--gguf", str(source), "-o", str(tmp_path / "out.gguf")]
    line = cli_error_line(args, capsys, caplog, folder=tmp_path)
    assert message.format(t=tmp_path) in line


def same_file_cases():
    def link(t):
        (t / "link.gguf").symlink_to("in.gguf")
        return t / "link.gguf"

    def hard(t):
        os.link(t / "in.gguf", t / "hard.gguf")
        return t / "hard.gguf"

    return [
        pytest.param(lambda t: t / "in.gguf", id="same-name"),
        pytest.param(lambda t: t / "sub" / ".." / "in.gguf", id="dotdot"),
        pytest.param(link, id="symlink-to-input"),
        pytest.param(hard, id="hard-link-to-input"),
    ]


@pytest.mark.parametrize("out", same_file_cases())
def test_output_that_is_the_input_is_refused(out, run_and_factors, tmp_path, capsys, caplog):
    run, _ = run_and_factors
    source = tiny_gguf(tmp_path / "in.gguf")[0]
    (tmp_path / "sub").mkdir()
    target = out(tmp_path)
    args = ["export", str(run), "--gguf", str(source), "-o", str(target)]
    line = cli_error_line(args, capsys, caplog, folder=tmp_path)
    assert line.endswith("is the --gguf input itself, which is never modified; give another file name")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--gguf: give -o OUT.gguf, the copy to write (IN.gguf is never modified)"),
        (["-o", "-"], "--gguf: give -o OUT.gguf, the copy to write"),
        (["-o", "{t}/out.gguf", "--format", "json"], "--format json: not with --gguf, whose output is a GGUF file"),
        (["-o", "{t}/out.json"], "-o '{t}/out.json': with --gguf the output is a GGUF file; name it .gguf"),
        (["-o", "{t}/no/out.gguf"], "-o '{t}/no/out.gguf': the folder '{t}/no' does not exist; create it first"),
    ],
)
def test_gguf_output_arguments_are_checked(extra, message, run_and_factors, tmp_path, capsys, caplog):
    run, _ = run_and_factors
    source = tiny_gguf(tmp_path / "in.gguf")[0]
    args = ["export", str(run), "--gguf", str(source), *[a.format(t=tmp_path) for a in extra]]
    if extra == []:
        args += ["--into", str(tmp_path / "model")]  # -o missing, though export has something else to do
    assert message.format(t=tmp_path) in cli_error_line(args, capsys, caplog, folder=tmp_path)


def test_short_factors_cannot_go_into_a_gguf(run_and_factors, tmp_path):
    _, factors = run_and_factors
    block = factors.rope_parameters.model_copy(update={"short_factor": [1.5] * 16})
    source = tiny_gguf(tmp_path / "in.gguf")[0]
    with pytest.raises(ExportError, match=r"searched short factors .* cannot be expressed"):
        write_gguf_export(factors.model_copy(update={"rope_parameters": block}), source, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf"]


def test_tiny_writer_refuses_another_vocabulary(tmp_path):
    model = tiny_llama()
    model.config.vocab_size = 300
    with pytest.raises(ValueError, match="vocab_size 300"):
        write_llama_gguf(model, tmp_path / "x.gguf")


def test_verify_row_says_why_short_factors_get_no_llama_cpp_check(run_and_factors):
    _, factors = run_and_factors
    block = factors.rope_parameters.model_copy(update={"short_factor": [1.5] * 16})
    ours = from_hf(block.model_dump(exclude_none=True), head_dim=32, max_position_embeddings=256)
    row = llama_cpp_row(factors.model_copy(update={"rope_parameters": block}), ours, None, None, logits=True)
    assert row.ok and row.cos_sin_max_diff == {} and row.source.startswith("not exportable to a GGUF: --gguf: these")
