"""What a job reads: the model (`model:`, how each worker loads it) and the data (`data:`: documents, tokenizer,
windows, objective)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from longrope.search.config.strict import MAX_COUNT, MAX_SEED, REFERENCE_MODEL, PathText, Strict
from longrope.workers.devices import device_problem
from longrope.workers.gguf_model import gguf_model_dir
from longrope.workers.objective_names import OBJECTIVES
from longrope.workers.reference_recipe import REFERENCE_MODEL_DIR


class ModelConfig(Strict):
    path: PathText = Field(
        default=REFERENCE_MODEL,
        description='a local model directory, a llama or gemma3 .gguf file (converted once, cached), or "reference" '
        "for the shipped reference model",
    )
    device: str = Field(
        default="auto", description="where each worker runs the model: auto (CUDA if torch sees one, else cpu), cuda:1"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="the model's weights and activations; auto: bfloat16 on a GPU, float32 on the CPU"
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        default="sdpa", description="transformers' attention kernel"
    )
    trust_remote_code: bool = Field(
        default=False, description="let transformers run the model directory's own Python code (custom models)"
    )
    config_overrides: dict[str, Any] = Field(
        default={},
        description="model config attributes changed at load, through the model's config class, e.g. "
        "{rms_norm_eps: 1e-5}; a window turned off here ({sliding_window: null}) is exported as sliding_window: full; "
        "a mapping given with --set replaces this one whole",
    )
    sliding_window: Literal["keep", "full"] | None = Field(
        default=None,
        description="for a model whose every layer has a sliding window shorter than the target: keep (score and "
        "deploy the window) or full (attention over the whole target; export --into turns the window off); "
        "required there, refused where the window is local by design (Gemma 2 and 3)",
    )

    def scored_window(self) -> Literal["keep", "full"] | None:
        """What the scored model did with its sliding window, as the export records it: `sliding_window`, or `full`
        where `config_overrides` turned the window off (`sliding_window: null`), so that `export --into` deploys
        the model that was scored."""
        if self.sliding_window is None and "sliding_window" in self.config_overrides:
            return "full" if self.config_overrides["sliding_window"] is None else None
        return self.sliding_window

    @property
    def is_reference(self) -> bool:
        return self.path == REFERENCE_MODEL

    @property
    def is_gguf(self) -> bool:
        return self.path.endswith(".gguf")

    def directory(self) -> Path:
        """The model's directory: the reference model's inside the installed package, a `.gguf` file's converted
        copy (made on first use, `gguf_model_dir`), or `path` as given."""
        if self.is_gguf:
            return gguf_model_dir(Path(self.path))
        return REFERENCE_MODEL_DIR if self.is_reference else Path(self.path)

    @field_validator("device")
    @classmethod
    def _torch_device(cls, value: str) -> str:
        problem = device_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class DataConfig(Strict):
    search_source: PathText = Field(
        default="corpus:search",
        description="the search's documents: corpus:<split> (shipped), a file, or a folder of txt/md/jsonl/parquet",
    )
    test_source: PathText = Field(default="corpus:test", description="compare's documents, as search_source")
    tokenizer: PathText = Field(
        default="model",
        min_length=1,
        description='"model": AutoTokenizer from the model directory; "bytes": one token per UTF-8 byte; any other '
        "value: a tokenizer directory of its own (read only where `longrope search` runs)",
    )
    text_field: str = Field(default="text", description="the field of a jsonl / parquet record that holds the text")
    search_windows: int = Field(
        default=8, ge=1, le=MAX_COUNT, description="windows every candidate is scored on (per objective)"
    )
    test_windows: int = Field(default=32, ge=1, le=MAX_COUNT, description="windows per length in `longrope compare`")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="which windows are cut from the documents")
    cache_dir: PathText | None = Field(
        default=None, description="where tokenized windows are cached; null: OUTPUT_DIR/windows-cache"
    )
    objective: str | dict[str, float] = Field(
        default="perplexity",
        description="what a candidate's score counts: perplexity (every position), tail (positions at or past "
        "original_length), needle (a hidden number's tokens), or weights for a mix, {perplexity: 1, needle: 1}",
    )

    @field_validator("objective", mode="before")
    @classmethod
    def _name_or_weights(cls, value):
        if isinstance(value, dict):
            for name, weight in value.items():
                if not isinstance(weight, int | float) or isinstance(weight, bool):
                    raise ValueError(f"{name}: the weight must be a number, got {weight!r}")
        elif not isinstance(value, str):
            raise ValueError("must be an objective name or a mapping of objective names to weights")
        return value

    def _given_weights(self) -> dict[str, float]:
        return self.objective if isinstance(self.objective, dict) else {self.objective: 1.0}

    @model_validator(mode="after")
    def _objective(self) -> DataConfig:
        weights = self._given_weights()
        unknown = [name for name in weights if name not in OBJECTIVES]
        if unknown:
            raise ValueError(f"objective: unknown objective {unknown[0]!r} (expected one of {', '.join(OBJECTIVES)})")
        negative = [name for name, weight in weights.items() if weight < 0]
        if negative:
            raise ValueError(f"objective: weight of {negative[0]!r} must be >= 0, got {weights[negative[0]]}")
        if sum(weights.values()) <= 0:
            raise ValueError(f"objective: weights must sum to more than 0, got {dict(weights)}")
        return self

    def objective_weights(self) -> dict[str, float]:
        """The objectives with a positive weight, in a fixed order (perplexity, tail, needle)."""
        weights = self._given_weights()
        return {name: float(weights[name]) for name in OBJECTIVES if weights.get(name, 0) > 0}
