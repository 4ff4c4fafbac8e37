"""What a job resolves from its config before any scoring: the model's RoPE, lengths, tokenizer, windows,
the baseline methods and the search seeds. Every check that can fail on bad input runs here, first."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from longrope.encodings import (
    DynamicNtkRope,
    LinearRope,
    Llama3Rope,
    LongRope,
    NtkRope,
    RopeMethod,
    YarnRope,
)
from longrope.search.factors_file import FactorsFile
from longrope.search.genome import Seed
from longrope.search.job_config import JobConfig, JobConfigError, check_lengths_message
from longrope.search.run_store import RunDir
from longrope.workers.documents import read_source
from longrope.workers.models import check_model, model_rope, read_model_config
from longrope.workers.pool import ModelSpec, PoolSpec
from longrope.workers.reference_model import reference_model_dir
from longrope.workers.tokenization import BYTE_TOKENIZER, TextTokenizer
from longrope.workers.windows import Windows, load_windows

REFERENCE = "reference"


@dataclass
class JobContext:
    config: JobConfig
    model_dir: Path
    original_length: int
    method: RopeMethod  # the model's own RoPE (its theta, head_dim, partial rotary)
    tokenizer: TextTokenizer
    _seeds: list[Seed] | None = field(default=None, init=False, repr=False)

    @classmethod
    def resolve(cls, config: JobConfig) -> JobContext:
        model_dir = reference_model_dir() if config.model.path == REFERENCE else Path(config.model.path)
        try:
            rope = model_rope(read_model_config(model_dir))
        except ValueError as exc:
            raise JobConfigError(f"model.path: {exc}") from None
        original = config.original_length or rope.original_length
        if config.target_length <= original:
            raise JobConfigError(check_lengths_message(original, config.target_length))
        use_bytes = config.data.tokenizer == "bytes" or config.model.path == REFERENCE
        tokenizer = TextTokenizer(
            BYTE_TOKENIZER if use_bytes else model_dir, trust_remote_code=config.model.trust_remote_code
        )
        return cls(config, model_dir, original, rope.method, tokenizer)

    @property
    def target_length(self) -> int:
        return self.config.target_length

    @property
    def scale(self) -> float:
        return self.target_length / self.original_length

    @property
    def pairs(self) -> int:
        return self.method.rotary_dim // 2

    def windows(self, source: str, length: int, count: int) -> Windows:
        """`count` windows of `length` tokens read at `length` positions (so length + 1 tokens each)."""
        data = self.config.data
        documents = read_source(source, text_field=data.text_field)
        cache = Path(data.cache_dir) if data.cache_dir else Path(self.config.output_dir) / "windows-cache"
        return load_windows(documents, self.tokenizer, length=length + 1, count=count, seed=data.seed, cache_dir=cache)

    def longrope(self, factors, *, attention_factor: float | None = None, n_hat: int = 0) -> LongRope:
        return LongRope.from_factors(
            factors,
            head_dim=self.method.head_dim,
            original_length=self.original_length,
            target_length=self.target_length,
            rope_theta=self.method.rope_theta,
            partial_rotary_factor=self.method.partial_rotary_factor,
            attention_factor=attention_factor,
            n_hat=n_hat,
        )

    def baselines(self) -> dict[str, RopeMethod]:
        """The closed-form methods at their nominal settings for this job's scale."""
        shape = {
            "head_dim": self.method.head_dim,
            "rope_theta": self.method.rope_theta,
            "partial_rotary_factor": self.method.partial_rotary_factor,
        }
        s, original, target = self.scale, self.original_length, self.target_length
        return {
            "none": RopeMethod(max_position_embeddings=target, **shape),
            "pi": LinearRope(max_position_embeddings=target, factor=s, **shape),
            "ntk": NtkRope(max_position_embeddings=target, factor=s, **shape),
            "dynamic": DynamicNtkRope(max_position_embeddings=original, factor=s, **shape),
            "yarn": YarnRope(
                max_position_embeddings=target, factor=s, original_max_position_embeddings=original, **shape
            ),
            "llama3": Llama3Rope(
                max_position_embeddings=target,
                factor=s,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=original,
                **shape,
            ),
        }

    def seeds(self) -> list[Seed]:
        """Resolved once per job (seed files and other runs' directories are read once): the check, the search
        problem and job.json's seeds hash all see the same seeds."""
        if self._seeds is None:
            baselines = self.baselines()
            closed_form = [
                Seed(
                    name, baselines[name].factors(self.target_length).double().numpy(), baselines[name].attention_factor
                )
                for name in self.config.search.seeds
            ]
            self._seeds = closed_form + [self.seed_from_file(path) for path in self.config.search.seed_files]
        return list(self._seeds)

    def seed_from_file(self, path: str) -> Seed:
        """A factors JSON (what `longrope export` writes), or another run's directory (its best candidate)."""
        if Path(path).is_dir():
            best = RunDir(path).best_record()
            factors, attention = np.asarray(best["factors"], dtype=np.float64), best["attention_factor"]
            where = f"search.seed_files: {path}: best candidate's factors"
        else:
            block = read_factors_file(path).rope_parameters
            factors, attention = np.asarray(block.long_factor, dtype=np.float64), block.attention_factor
            where = f"search.seed_files: {path}: rope_parameters.long_factor"
        if len(factors) != self.pairs:
            raise JobConfigError(f"{where}: expected {self.pairs} factors (rotary_dim / 2), got {len(factors)}")
        if factors.min() < 1.0:
            raise JobConfigError(f"{where}: factors must be >= 1, got {factors.min()} at pair {int(factors.argmin())}")
        decreasing = np.flatnonzero(np.diff(factors) < 0)
        if len(decreasing):
            i = int(decreasing[0])
            raise JobConfigError(
                f"{where}: factors must be non-decreasing, got {factors[i]} then {factors[i + 1]} at pair {i + 1}"
            )
        return Seed(f"file:{Path(path).name}", factors, attention)

    def check_model(self) -> None:
        """Load-check the model in the driver (meta device, no weights read) before any worker starts; the
        device is checked only for the embedded Ray, whose workers share this machine."""
        model = self.config.model
        check_model(
            self.model_dir,
            device=model.device,
            attn_implementation=model.attn_implementation,
            trust_remote_code=model.trust_remote_code,
            config_overrides=dict(model.config_overrides),
            check_device=self.config.workers.address is None,
        )

    def model_spec(self) -> ModelSpec:
        model, workers = self.config.model, self.config.workers
        return ModelSpec(
            model_dir=str(self.model_dir),
            device=model.device,
            dtype=model.dtype,
            attn_implementation=model.attn_implementation,
            trust_remote_code=model.trust_remote_code,
            config_overrides=dict(model.config_overrides),
            candidates_per_forward=workers.candidates_per_forward,
        )

    def pool_spec(self) -> PoolSpec:
        workers = self.config.workers
        return PoolSpec(
            num_workers=workers.num_workers,
            num_gpus_per_worker=workers.num_gpus_per_worker,
            num_cpus_per_worker=workers.num_cpus_per_worker,
            address=workers.address,
            batch_size=workers.batch_size,
            local_num_cpus=workers.local_num_cpus,
        )


def read_factors_file(path: str | Path) -> FactorsFile:
    file = Path(path)
    if not file.is_file():
        raise JobConfigError(f"factors file {str(path)!r}: no such file")
    try:
        return FactorsFile.model_validate(json.loads(file.read_text()))
    except json.JSONDecodeError as exc:
        raise JobConfigError(f"factors file {str(path)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise JobConfigError(f"factors file {str(path)!r}: {field}: {first['msg']}") from None
