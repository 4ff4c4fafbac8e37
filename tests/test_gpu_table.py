"""bench/gpu_table.py and bench/gpu_parts.py cannot rot: the parts a GPU run joins are the file split here, a part
missing, out of order or damaged is refused with one line and exit 2 and nothing written, the window rule and the
plans (SmolLM2's two searches; Gemma 3's descent with its windows per target) are what their docstrings say, the GPU
side converts a Gemma 3 GGUF as transformers does, bench/README.md gives the runs the script makes for each model,
and (slow) each model's whole sequence runs on tiny shapes on the CPU, as on the GPU machine (no install, no Ray), to
a table with every row."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gpu_table_parts.bundle import ONE_PER_DOCUMENT, SPREAD, cut_windows, spread_windows
from gpu_table_parts.plan import POLISH_STEPS, TABLE_ROWS, Timing, make_plan, search_seconds, table_rows
from gpu_table_parts.profiles import GEMMA3, PROFILES

from longrope.search.optimizers.history_record import HistoryRecord

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "bench" / "gpu_parts.py"


def parts_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PARTS), *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def split_file(tmp_path):
    """A 100,000-byte file cut into 4 parts of at most 30,000 bytes: (the file, the parts' folder, the part paths)."""
    data = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    done = parts_cli("split", source, "--into", tmp_path / "parts", "--max-bytes", 30_000)
    assert done.returncode == 0, done.stderr
    parts = sorted((tmp_path / "parts").glob("model.gguf.*"))
    return source, tmp_path / "parts", parts


def test_the_parts_join_to_the_file_in_order(split_file, tmp_path):
    source, folder, parts = split_file
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [p.name for p in parts] == [f"model.gguf.00{k}" for k in range(4)]
    assert [p.stat().st_size for p in parts] == [25_000] * 4  # equal parts: ceil(100000 / 30000) = 4
    assert manifest["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    into = tmp_path / "there"
    for number, part in enumerate(parts, 1):
        done = parts_cli("join", part, "--into", into)
        assert done.returncode == 0, done.stderr
        assert (into / "model.gguf").exists() == (number == 4)
    assert hashlib.sha256((into / "model.gguf").read_bytes()).hexdigest() == manifest["sha256"]
    assert json.loads((into / "model.gguf.join.json").read_text())["complete"] is True
    again = parts_cli("join", parts[0], "--into", into)  # a run repeated after a failed transfer: nothing to do
    assert again.returncode == 0 and "already appended" in again.stdout


def refused(done: subprocess.CompletedProcess, *words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_a_missing_part_is_refused_naming_it_and_nothing_is_written(split_file, tmp_path):
    _, _, parts = split_file
    parts[0].unlink()
    into = tmp_path / "there"
    refused(parts_cli("join", parts[0], "--into", into), "part model.gguf.000", "missing")
    assert not into.exists()


def test_a_part_out_of_order_is_refused_naming_the_next_and_nothing_is_written(split_file, tmp_path):
    _, _, parts = split_file
    into = tmp_path / "there"
    refused(
        parts_cli("join", parts[1], "--into", into), "part model.gguf.001", "out of order", "model.gguf.000 is next"
    )
    assert not into.exists()  # a fresh machine: the first part must come first
    assert parts_cli("join", parts[0], "--into", into).returncode == 0
    before = {p.name: p.read_bytes() for p in into.iterdir()}
    refused(parts_cli("join", parts[2], "--into", into), "part model.gguf.002", "1 of 4", "model.gguf.001 is next")
    assert {p.name: p.read_bytes() for p in into.iterdir()} == before


def test_a_damaged_part_is_refused_and_a_killed_append_is_cut_back(split_file, tmp_path):
    source, _, parts = split_file
    into = tmp_path / "there"
    assert parts_cli("join", parts[0], "--into", into).returncode == 0
    good = parts[1].read_bytes()
    parts[1].write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    refused(parts_cli("join", parts[1], "--into", into), "part model.gguf.001", "sha256")
    parts[1].write_bytes(good)
    with open(into / "model.gguf.partial", "ab") as partial:  # a run killed mid-append left bytes past part 000
        partial.write(b"half a part")
    for part in parts[1:]:
        assert parts_cli("join", part, "--into", into).returncode == 0
    assert (into / "model.gguf").read_bytes() == source.read_bytes()


@pytest.mark.parametrize(
    "damage",
    ["partial-lost", "partial-cut", "join-record-unreadable", "joined-file-lost"],
)
def test_a_join_whose_bytes_are_gone_starts_again_at_the_first_part(split_file, tmp_path, damage):
    """join.json is trusted only as far as the bytes on disk hold its parts: with FILE.partial lost or cut short,
    join.json unreadable, or the joined file removed, part 000 starts the join afresh (it does not answer "already
    appended" while part 001 is refused for want of it), and the file joins whole."""
    source, _, parts = split_file
    into = tmp_path / "there"
    joined = parts if damage == "joined-file-lost" else parts[:2]
    for part in joined:
        assert parts_cli("join", part, "--into", into).returncode == 0
    if damage == "partial-lost":
        (into / "model.gguf.partial").unlink()
    elif damage == "partial-cut":
        with open(into / "model.gguf.partial", "r+b") as partial:
            partial.truncate(30_000)  # part 000 and a fifth of 001: the record says 50,000 bytes
    elif damage == "join-record-unreadable":
        (into / "model.gguf.join.json").write_text("{")
    else:
        (into / "model.gguf").unlink()
    first = parts_cli("join", parts[0], "--into", into)
    assert first.returncode == 0 and "appended, 1 of 4" in first.stdout, (first.stdout, first.stderr)
    refused(parts_cli("join", parts[2], "--into", into), "part model.gguf.002", "1 of 4", "model.gguf.001 is next")
    for part in parts[1:]:
        assert parts_cli("join", part, "--into", into).returncode == 0
    assert (into / "model.gguf").read_bytes() == source.read_bytes()


def test_a_join_killed_after_the_file_was_renamed_into_place_is_complete(split_file, tmp_path):
    """The last part renamed FILE.partial to FILE, then the run was killed before join.json said so: the file is
    whole (its sha256 is the manifest's), so no part is carried again."""
    source, _, parts = split_file
    into = tmp_path / "there"
    for part in parts[:3]:
        assert parts_cli("join", part, "--into", into).returncode == 0
    record = (into / "model.gguf.join.json").read_bytes()
    assert parts_cli("join", parts[3], "--into", into).returncode == 0
    (into / "model.gguf.join.json").write_bytes(record)  # as the kill left it: 3 of 4, not complete
    for part in (parts[3], parts[0]):
        again = parts_cli("join", part, "--into", into)
        assert again.returncode == 0 and "already appended (4 of 4)" in again.stdout, (again.stdout, again.stderr)
    assert (into / "model.gguf").read_bytes() == source.read_bytes()


def test_the_windows_rule_one_per_document_else_spread_over_the_longest():
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 50, n) for n in (40, 100, 35, 10, 64)]
    names = [f"d{k}" for k in range(5)]
    meta, tokens = cut_windows(docs, names, split="test", length=31, count=3, seed=0)
    assert meta.rule == ONE_PER_DOCUMENT and len(set(meta.names)) == 3 and tokens.shape == (3, 32)
    meta, tokens = cut_windows(docs, names, split="test", length=31, count=6, seed=0)  # 4 documents of 32
    assert meta.rule == SPREAD and tokens.shape == (6, 32)
    counts = {name: meta.names.count(name) for name in set(meta.names)}
    assert set(counts) == {"d0", "d1", "d2", "d4"} and counts["d1"] == 2 and counts["d4"] == 2  # all once, then twice
    for name, offset, window in zip(meta.names, meta.offsets, tokens, strict=True):
        assert np.array_equal(window, docs[names.index(name)][offset : offset + 32])
    d1 = sorted(o for n, o in zip(meta.names, meta.offsets, strict=True) if n == "d1")
    assert d1[1] - d1[0] >= 32  # disjoint
    assert cut_windows(docs, names, split="test", length=31, count=6, seed=0)[0] == meta  # seeded
    with pytest.raises(ValueError, match="8 disjoint windows of 32 tokens wanted, 7 fit in the 4 documents"):
        spread_windows(docs, names, length=32, count=8, seed=0)


def planned(budget) -> int:
    """What a planned search's settings score at most, by the optimizers' own `plan`, and its seeds."""
    from longrope.search.config.search_section import SearchConfig
    from longrope.search.optimizers.factory import search_plan

    settings = SearchConfig.model_validate(budget.search)
    return search_plan(settings, settings.most_seeds()).candidates, settings.most_seeds()


def test_the_plan_puts_the_table_first_and_fits_the_searches_in_what_is_left():
    timings = [
        Timing(length=32768, forward_seconds=0.2, gradient_seconds=0.9),
        Timing(length=65536, forward_seconds=0.7, gradient_seconds=3.0),
    ]
    tuning = {32768: 10, 65536: 10}
    plan = make_plan(timings, 900, tuning_settings=tuning, search_windows=4, test_windows=16)
    assert plan.table_seconds == pytest.approx(0.2 * (40 + TABLE_ROWS * 16) + 0.7 * (40 + TABLE_ROWS * 16))
    left = 900 - plan.table_seconds
    ga, descent = plan.ga, plan.descent
    assert ga.search["surrogate"] == {"enabled": True} and ga.search["population"] == 16
    # the GA then its polish (the hybrid): 6 steps, each a gradient pass on 3 windows and a forward on 1, and the
    # polished point on the grid, a forward on all 4
    step = 3 * 3.9 + 0.9
    assert ga.search["optimizer"] == "hybrid" and ga.backward_steps == POLISH_STEPS == 6
    assert planned(ga) == (ga.candidates, 8)  # PI, NTK, YaRN and the tuning grids' scales (3 NTK, 2 YaRN)
    evolution = ga.candidates - POLISH_STEPS - 1
    assert ga.seconds == pytest.approx((evolution + 1) * 4 * 0.9 + POLISH_STEPS * step) and ga.seconds <= left * 2 / 3
    one_more = ga.candidates + 8  # a generation scores half of its 16 children (the surrogate keeps the rest out)
    assert search_seconds(one_more, POLISH_STEPS, timings, 4) > left * 2 / 3
    # descent: the 8 seeds, a gradient pass on 3 windows and a forward on 1 per step, the rounded point
    assert descent.seconds == pytest.approx((8 + 1) * 4 * 0.9 + descent.backward_steps * step)
    assert ga.seconds + descent.seconds <= left < ga.seconds + descent.seconds + step  # no room for one more step
    starved = make_plan(timings, 100, tuning_settings=tuning, search_windows=4, test_windows=16)
    assert starved.ga is None and starved.descent is None and "no search" in starved.note


def test_gemma3s_plan_counts_each_targets_windows_and_gives_descent_all_that_is_left():
    """Gemma 3's table: 3 search windows at both targets, 8 test windows at 64k and 4 at 128k, descent only (the
    baselines and one searched row), with the CPU config's step size and patience."""
    timings = [
        Timing(length=65536, forward_seconds=0.35, gradient_seconds=1.5),
        Timing(length=131072, forward_seconds=0.9, gradient_seconds=4.0),
    ]
    tuning = {65536: 15, 131072: 15}
    test = GEMMA3.test_windows
    plan = make_plan(
        timings,
        424,
        tuning_settings=tuning,
        search_windows=GEMMA3.search_windows,
        test_windows=test,
        optimizers=GEMMA3.optimizers,
        descent=GEMMA3.descent,
    )
    assert test == {65536: 8, 131072: 4} and table_rows(GEMMA3.optimizers) == 11 == TABLE_ROWS - 2
    assert plan.table_seconds == pytest.approx(0.35 * (15 * 3 + 11 * 8) + 0.9 * (15 * 3 + 11 * 4))
    assert plan.ga is None and "GA" not in plan.note
    descent = plan.descent
    assert descent.search["gradient"] == {
        "learning_rate": 0.05,
        "patience": 3,
        "steps": descent.backward_steps,
        "holdout_windows": 1,
    }
    step = (2 * 1.5 + 0.35) + (2 * 4.0 + 0.9)  # 2 gradient windows and 1 held out, at each target
    seeds = (8 + 1) * (3 * 0.35 + 3 * 0.9)  # the seeds and the point rounded to the grid, on all 3 windows
    assert planned(descent)[0] == 8 + descent.backward_steps + 1
    assert descent.seconds == pytest.approx(seeds + descent.backward_steps * step)
    left = 424 - plan.table_seconds
    assert descent.seconds <= left < descent.seconds + step and descent.backward_steps == 21  # bench/README.md's


@pytest.mark.parametrize("model", sorted(PROFILES))
def test_the_readme_gives_the_runs_the_script_makes(model):
    """SmolLM2's 98 MB GGUF in 4 runs, Gemma 3's 253 MB in 9, each run's command within the tool's 2,000 characters
    and 8 carried paths, the last writing the model's own result file."""
    import gpu_table

    profile = PROFILES[model]
    runs = gpu_table.profile_runs(profile)
    assert len(runs) == {"smollm2-135m": 4, "gemma3-270m": 9}[model]
    assert all(len(run.command) <= 2000 and len(run.carry) <= 8 for run in runs)
    assert f'--out "$OUT/{profile.result}.json"' in runs[-1].command and f"{profile.stage}/bundle" in runs[-1].carry
    readme = (ROOT / "bench" / "README.md").read_text()
    for run in runs:
        assert run.command in readme and ", ".join(f'"{c}"' for c in run.carry) in readme
    assert f"timeout_s {runs[-1].timeout_s}" in readme


def test_full_parts_leave_the_last_part_the_rest(tmp_path):
    """`--full-parts` (Gemma 3's GGUF: 8 x 30 MB and 13 MB, beside which the bundle travels): every part the most
    but the last, and they join to the file."""
    data = np.random.default_rng(2).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    done = parts_cli("split", source, "--into", tmp_path / "parts", "--max-bytes", 30_000, "--full-parts")
    assert done.returncode == 0, done.stderr
    parts = sorted((tmp_path / "parts").glob("model.gguf.*"))
    assert [p.stat().st_size for p in parts] == [30_000, 30_000, 30_000, 10_000]
    for part in parts:
        assert parts_cli("join", part, "--into", tmp_path / "there").returncode == 0
    assert (tmp_path / "there" / "model.gguf").read_bytes() == data


def test_the_gpu_side_converts_a_gemma3_gguf_as_transformers_does(tmp_path):
    """gguf_weights (gguf-py alone, the GPU side) on a tiny Gemma 3 GGUF quantized as the real one (Q8_0, Q5_0, Q4_K,
    Q6_K, F32 norms) gives the weights, bit for bit, that the project's converter (transformers' GGUF loader) writes:
    llama.cpp's norm + 1 undone, no q/k permutation. A GGUF of another architecture than config.json's is refused."""
    from gpu_table_parts import dry, dry_gemma3
    from gpu_table_parts.gguf_weights import gguf_state_dict, safetensors_digest, weights_digest

    gguf = dry_gemma3.tiny_gguf(tmp_path / "tiny-gemma3.gguf")
    reference = dry.reference_dir(gguf, tmp_path / "reference")
    config = json.loads((reference / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == dry_gemma3.WINDOW
    assert {"sliding_attention", "full_attention"} == set(config["layer_types"])
    state = gguf_state_dict(gguf, config)
    assert weights_digest(state) == safetensors_digest(reference / "model.safetensors")
    model = dry_gemma3.tiny_model()  # the weights the GGUF was written from: its norms stored as 1 + weight
    norm = "model.layers.0.input_layernorm.weight"
    assert np.allclose(state[norm], model.state_dict()[norm].numpy(), atol=1e-6)
    llama = dry.tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(ValueError, match=r"a 'llama' GGUF, but config\.json's model is 'gemma3'"):
        gguf_state_dict(llama, config)


@pytest.mark.slow
def test_dry_run_gives_every_row_at_both_targets_and_refuses_bad_input(tmp_path):
    work, out = tmp_path / "work", tmp_path / "dry.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_table.py"), "dry-run", "--work", str(work), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["finished"] and result["dry_run"] and "longrope-shim" in result["package"]  # nothing installed
    assert (work / "gpu" / "tiny.gguf").read_bytes() == (work / "tiny.gguf").read_bytes()
    rows = {"none", "pi", "ntk", "dynamic", "yarn", "llama3", "ntk_tuned", "yarn_tuned"}
    rows |= {"ntk_longrope_attention", "yarn_longrope_attention", "searched: GA + surrogate", "searched: descent"}
    rows |= {"searched: hybrid"}
    assert result["plan"]["ga"] and result["plan"]["descent"]
    for target in ("256", "512"):
        entry = result["targets"][target]
        assert set(entry["per_window"]) == rows and all(len(v) == 16 for v in entry["per_window"].values())
        methods = entry["compare"]["methods"]
        assert set(methods) == rows and entry["compare"]["windows"] == {target: 16}
        best = entry["compare"]["best_baseline"]
        assert methods[best]["paired_difference_to_best_baseline"] == pytest.approx([0.0, 0.0, 0.0])
        assert all(f"| {row} |" in entry["table"] for row in rows)
        assert (work / "out" / f"gpu_table_paired_difference_{target}.png").stat().st_size > 0
        hybrid, descent = entry["searches"]["hybrid"], entry["searches"]["gradient"]
        assert hybrid["search"]["surrogate"] == {"enabled": True} and hybrid["scored"] == len(hybrid["history"]) >= 4
        assert descent["backward_steps"] >= 1
        for record in hybrid["history"] + descent["history"]:
            HistoryRecord.model_validate(record)  # what history.jsonl would hold
        assert hybrid["best_search_nll"] == min(r["mean_nll"] for r in hybrid["history"])
        # the GA's row: its best before the polish, whose 6 steps (a backward pass each) and point on the grid come
        # after every generation of the GA, numbered the one after its last; the point on the grid is a line of its
        # own unless it is a candidate already scored (told its record, as the coordinator does)
        generations = hybrid["search"]["generations"]
        ga = [r for r in hybrid["history"] if r["generation"] <= generations]
        polish = hybrid["history"][len(ga) :]
        assert all(r["generation"] == generations + 1 for r in polish)
        assert [bool(r.get("backward_windows")) for r in polish] in ([True] * 6 + [False], [True] * 6)
        assert len({r["key"] for r in hybrid["history"]}) == len(hybrid["history"])
        assert hybrid["backward_steps"] == 6
        assert hybrid["before_polish"]["mean_nll"] == min(r["mean_nll"] for r in ga)
    sections = [f"## {result['targets'][t]['compare']['original_length']} -> {t}" for t in ("256", "512")]
    tables = [result["targets"][t]["table"] for t in ("256", "512")]
    assert (work / "out" / "gpu_table.md").read_text() == "\n".join(
        f"{s}\n\n{t}\n" for s, t in zip(sections, tables, strict=True)
    )

    run = [sys.executable, str(ROOT / "bench" / "gpu_table.py"), "run", "--device", "cpu", "--out"]
    damaged = tmp_path / "damaged.gguf"
    data = bytearray((work / "tiny.gguf").read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    bundle = work / "stage" / "bundle"
    done = subprocess.run(
        [*run, str(tmp_path / "a.json"), "--gguf", str(damaged), "--bundle", str(bundle)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "has sha256" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "a.json").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "windows.safetensors").write_bytes((bundle / "windows.safetensors").read_bytes())
    record = json.loads((bundle / "bundle.json").read_text()) | {"weights_digest": "0" * 64}
    (other / "bundle.json").write_text(json.dumps(record))
    done = subprocess.run(
        [
            *run,
            str(tmp_path / "b.json"),
            "--gguf",
            str(work / "gpu" / "tiny.gguf"),
            "--bundle",
            str(other),
            "--work",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "weights hash to" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_gemma3_dry_run_gives_every_row_at_2x_and_4x_through_local_and_global_layers(tmp_path):
    """Gemma 3's sequence on tiny shapes: a random gemma3_text model (5 sliding-window layers, window 32, and a full
    one) as a Q4_K_M-typed GGUF in 3 full parts, its windows one per document, converted on the 'GPU' side and checked
    against transformers' conversion, then every baseline (the model as shipped, `none`, among them), NTK and YaRN
    tuned and descent (the CPU config's step size), at 2x and 4x, 8 and 4 test windows, paired against the best."""
    from longrope.search.reports.compare_result import BASELINES

    work, out = tmp_path / "work", tmp_path / "dry.json"
    script = [sys.executable, str(ROOT / "bench" / "gpu_table.py"), "dry-run", "--model", "gemma3-270m"]
    done = subprocess.run([*script, "--work", str(work), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["finished"] and result["dry_run"] and "longrope-shim" in result["package"]  # nothing installed
    assert result["gguf"] == "tiny-gemma3.gguf"
    assert (work / "gpu" / "tiny-gemma3.gguf").read_bytes() == (work / "tiny-gemma3.gguf").read_bytes()
    sizes = [part.stat().st_size for part in sorted((work / "stage" / "parts").glob("tiny-gemma3.gguf.*"))]
    assert len(sizes) == 3 and sizes[0] == sizes[1] > sizes[2]  # full parts: the last one the rest
    config = json.loads((work / "reference" / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == 32 < 256
    assert set(config["layer_types"]) == {"sliding_attention", "full_attention"}
    bundle = json.loads((work / "stage" / "bundle" / "bundle.json").read_text())
    assert bundle["original_length"] == 128 and bundle["targets"] == [256, 512]
    assert bundle["optimizers"] == ["gradient"] and all(w["rule"] == ONE_PER_DOCUMENT for w in bundle["windows"])
    assert result["plan"]["ga"] is None and result["plan"]["descent"]
    rows = {*BASELINES, "searched: descent"}
    for target, windows in (("256", 8), ("512", 4)):
        entry = result["targets"][target]
        assert set(entry["per_window"]) == rows and all(len(v) == windows for v in entry["per_window"].values())
        methods = entry["compare"]["methods"]
        assert set(methods) == rows and entry["compare"]["windows"] == {target: windows}
        best = entry["compare"]["best_baseline"]
        assert methods[best]["paired_difference_to_best_baseline"] == pytest.approx([0.0, 0.0, 0.0])
        assert all(f"| {row} |" in entry["table"] for row in rows)
        assert (work / "out" / f"gpu_table_gemma3_paired_difference_{target}.png").stat().st_size > 0
        assert set(entry["searches"]) == {"gradient"}
        descent = entry["searches"]["gradient"]
        assert descent["search"]["gradient"]["learning_rate"] == 0.05 and descent["backward_steps"] >= 1
        for record in descent["history"]:
            HistoryRecord.model_validate(record)  # what history.jsonl would hold
        assert descent["best_search_nll"] == min(r["mean_nll"] for r in descent["history"])
    assert (work / "out" / "gpu_table_gemma3.md").read_text().startswith("## 128 -> 256\n")
