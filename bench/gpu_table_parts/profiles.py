"""The models the GPU table is prepared for, one lease each (`gpu_table.py --model`): what each one's table holds and
why it is sized so. bench/README.md gives the lease arithmetic behind these numbers.

Both read the manuals corpus (`longrope corpus get manuals`), cut by the project's rule where enough documents are
long enough (bundle.py). SmolLM2-135M (8k): 32k and 64k, 4 search and 16 test windows, the GA screened by the
surrogate run as the hybrid, and descent; its lease ran on 2026-12-04.

Gemma 3 270M (32k): 64k and 128k (2x and 4x). In Gemma tokens the manuals' test split has 9 documents of at least
65,537 tokens and 4 of at least 131,073, the search split 5 and 3 (counted with models/gemma3-270m's tokenizer), so
3 search windows at both targets and 8 test windows at 64k, 4 at 128k are each one window per document, as `longrope
compare` cuts them, with no document read twice. Its search is descent only, with configs/gemma3-270m-64k-cpu.yaml's
step size and patience: at its per-window costs (a 128k forward about 0.9 s and a gradient pass about 4 s on one
H100, by `longrope estimate` at half its default MFU) a GA generation of 8 scored children would cost as much as 3
descent steps, and one backward pass prices all 128 frequency pairs of the full-attention layers. Its Q4_K_M GGUF is
253 MB, so it travels in 9 parts, 8 of 28.9 MB and the rest (21.9 MB) beside the 6.6 MB bundle (`full_parts`):
each of the 9 runs carries about 61 MiB of the 64 with the checkout (32.1 MB) and the wheels (3.0 MB).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MANUALS = {"search_source": "corpora/manuals/search", "test_source": "corpora/manuals/test"}
PART_BYTES = 30_000_000  # a part: 64 MiB a run, less the checkout (~32 MB), the wheels (~3 MB) and the bundle
HYBRID, DESCENT = "hybrid", "gradient"  # the search section's optimizer names: the GA + surrogate then polish; descent


class TableProfile(BaseModel):
    """One model's table: the GGUF that carries it, the lengths, the windows per target and the searches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str  # search/downloads/model_wheels.py's name (`longrope model get NAME`)
    reference: str  # the reference directory `longrope model get` writes, here
    gguf_name: str
    gguf_size: int  # the pinned GGUF's bytes: `sequence` names its parts without the file
    original: int  # the model's trained context (config.json's max_position_embeddings)
    targets: tuple[int, ...]
    search_windows: dict[int, int]  # per target
    test_windows: dict[int, int]
    optimizers: tuple[str, ...]  # HYBRID and/or DESCENT, each a search at every target
    descent: dict = {}  # the descent's gradient settings beyond plan.py's (steps, holdout_windows)
    sources: dict[str, str] = MANUALS
    stage: str  # here, under runs/ (ignored by git): the parts and the bundle
    result: str  # the result's stem: $OUT/RESULT.json, RESULT.md, RESULT_paired_difference_N.png
    part_bytes: int = PART_BYTES
    full_parts: bool = False  # parts of the whole part_bytes but the last (room beside it for the bundle)


def each(count: int, targets: tuple[int, ...]) -> dict[int, int]:
    return {target: count for target in targets}


SMOLLM2 = TableProfile(
    model="smollm2-135m",
    reference="models/smollm2-135m",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_size=98_362_432,
    original=8192,
    targets=(32768, 65536),
    search_windows=each(4, (32768, 65536)),
    test_windows=each(16, (32768, 65536)),
    optimizers=(HYBRID, DESCENT),
    stage="runs/gpu-table",
    result="gpu_table",
)
GEMMA3 = TableProfile(
    model="gemma3-270m",
    reference="models/gemma3-270m",
    gguf_name="gemma-3-270m-q4_k_m.gguf",
    gguf_size=253_113_024,
    original=32768,
    targets=(65536, 131072),
    search_windows=each(3, (65536, 131072)),
    test_windows={65536: 8, 131072: 4},
    optimizers=(DESCENT,),
    descent={"learning_rate": 0.05, "patience": 3},  # configs/gemma3-270m-64k-cpu.yaml's
    stage="runs/gpu-table-gemma3",
    result="gpu_table_gemma3",
    part_bytes=28_900_000,  # 8 parts and the rest (21.9 MB) with the 6.6 MB bundle: each run's carry alike
    full_parts=True,
)
PROFILES = {profile.model: profile for profile in (SMOLLM2, GEMMA3)}


def dry_profile(profile: TableProfile, *, gguf_name: str, gguf_size: int, original: int, targets: tuple[int, ...]):
    """The dry run's stand-in for `profile`: its windows per target, searches and layout, at tiny lengths, on the
    shipped corpus, under the dry run's own folders."""
    by_position = dict(zip(profile.targets, targets, strict=True))
    return profile.model_copy(
        update={
            "reference": "",
            "gguf_name": gguf_name,
            "gguf_size": gguf_size,
            "original": original,
            "targets": targets,
            "search_windows": {by_position[t]: n for t, n in profile.search_windows.items()},
            "test_windows": {by_position[t]: n for t, n in profile.test_windows.items()},
            "sources": {"search_source": "corpus:search", "test_source": "corpus:test"},
        }
    )
