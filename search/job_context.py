"""What a job resolves from its config before any scoring: the model's RoPE, lengths, tokenizer, windows,
the baseline methods and the search seeds. Every check that can fail on bad input runs here, first."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longrope.encodings import (
    DynamicNtkRope,
    LinearRope,
    Llama3Rope,
    LongRope,
    NtkRope,
    RopeMethod,
    YarnRope,
)
from longrope.search.factors_file import read_factors_file
from longrope.search.genome import SearchSpace, Seed, resolve_space
from longrope.search.job_config import JobConfig, JobConfigError, check_lengths_message
from longrope.search.job_record import JOB_FILE, RopeShape, read_job_record
from longrope.search.run_store import RunDir
from longrope.search.stages import last_stage
from longrope.workers.documents import read_source
from longrope.workers.models import check_model, model_rope, read_model_config
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.specs import ModelSpec, PoolSpec
from longrope.workers.tokenization import BYTE_TOKENIZER, TextTokenizer
from longrope.workers.windows import Windows, interleave_windows, load_windows

REFERENCE = "reference"


@dataclass
class JobContext:
    config: JobConfig
    model_dir: Path
    original_length: int
    method: RopeMethod  # the model's own RoPE (its theta, head_dim, partial rotary)
    tokenizer: TextTokenizer
    _seeds: list[Seed] | None = field(default=None, init=False, repr=False)
    _kept_long: Seed | None = field(default=None, init=False, repr=False)

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

    @property
    def short_search(self) -> bool:
        return self.config.search.factor == "short"

    @property
    def search_length(self) -> int:
        """Tokens per search window: the target, or original_length for a short-factor search (the longest
        prompt transformers reads with the short factors, `max(position) + 1 <= original`)."""
        return self.original_length if self.short_search else self.target_length

    def space(self) -> SearchSpace:
        """The search space, defaults resolved (a bad critical_dim or length_scale is one JobConfigError)."""
        return resolve_space(
            self.config.search,
            pairs=self.pairs,
            scale=self.scale,
            rope_theta=self.method.rope_theta,
            rotary_dim=self.method.rotary_dim,
            original_length=self.original_length,
        )

    def kept_long(self) -> Seed | None:
        """The long factors (and attention factor) a short-factor search keeps, from `search.long_factors`."""
        if not self.short_search:
            return None
        if self._kept_long is None:
            self._kept_long = self.seed_from_file(self.config.search.long_factors, field="search.long_factors")
        return self._kept_long

    def candidate(self, factors, *, attention_factor: float | None = None, n_hat: int = 0) -> LongRope:
        """What the search scores: searched long factors, or searched short factors beside the kept long ones
        (the attention factor is then the long factors', which transformers applies in both regimes)."""
        kept = self.kept_long()
        if kept is None:
            return self.longrope(factors, attention_factor=attention_factor, n_hat=n_hat)
        return self.longrope(kept.factors, attention_factor=kept.attention_factor, n_hat=n_hat, short_factor=factors)

    def windows(
        self, source: str, length: int, count: int, objective: str = "perplexity", *, cached: bool = True
    ) -> Windows:
        """`count` windows of `length` tokens read at `length` positions (so length + 1 tokens each), with the
        loss mask of `objective` (a tail starts at original_length); `cached=False` writes no cache (a check)."""
        data = self.config.data
        documents = read_source(source, text_field=data.text_field)
        cache = Path(data.cache_dir) if data.cache_dir else Path(self.config.output_dir) / "windows-cache"
        cache = cache if cached else None
        return load_windows(
            documents,
            self.tokenizer,
            length=length + 1,
            count=count,
            seed=data.seed,
            cache_dir=cache,
            objective=objective,
            original_length=self.original_length,
        )

    def objective_windows(self, source: str, length: int, count: int, *, cached: bool = True) -> Windows:
        """The job's windows for its objective mix: `count` per objective, in the order of `ObjectiveMix.of`.
        Perplexity and tail in one mix read the same documents twice."""
        weights = self.config.data.objective_weights()
        parts = [self.windows(source, length, count, objective, cached=cached) for objective in weights]
        return interleave_windows(parts)

    @property
    def shape(self) -> RopeShape:
        """The model's RoPE shape and the job's lengths, as job.json records them."""
        return RopeShape(
            original_length=self.original_length,
            target_length=self.target_length,
            rope_theta=self.method.rope_theta,
            head_dim=self.method.head_dim,
            partial_rotary_factor=self.method.partial_rotary_factor,
        )

    def longrope(
        self, factors, *, attention_factor: float | None = None, n_hat: int = 0, short_factor=None
    ) -> LongRope:
        return self.shape.longrope(factors, short_factor=short_factor, attention_factor=attention_factor, n_hat=n_hat)

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
            self.kept_long()  # a bad long_factors source stops here, with the other seed checks
            self._seeds = self._first_seeds() + [
                seed for path in self.config.search.seed_files for seed in self.seeds_from_file(path)
            ]
        return list(self._seeds)

    def _first_seeds(self) -> list[Seed]:
        """PI / NTK / YaRN / Llama 3 at the target (`search.seeds`); a short-factor search starts from all ones
        instead (the unscaled model: the closed forms are long-context methods)."""
        if self.short_search:
            return [Seed("ones", np.ones(self.pairs))]
        baselines = self.baselines()
        seeds = [
            Seed(name, baselines[name].factors(self.target_length).double().numpy(), baselines[name].attention_factor)
            for name in self.config.search.seeds
        ]
        return seeds + self._longrope2_ramp()

    def _longrope2_ramp(self) -> list[Seed]:
        """In the longrope2 space every closed form projects to S, S + step, ... on the searched pairs (they are
        all <= S there), which leaves room to move only at the top; a ramp from S to length_scale over the
        searched pairs (the pairs below derived, lambda_cd^(i/d_cd)) starts the population spread out."""
        space = self.space()
        if space.kind != "longrope2":
            return []
        step, searched = self.config.search.grid_step, self.pairs - space.critical_dim
        top = space.low + min(space.high - space.low, (searched - 1) * space.cap)  # each rise within the cap
        ramp = np.linspace(space.low, top, searched) * step
        critical = ramp[0]
        below = critical ** (np.arange(space.critical_dim) / max(space.critical_dim, 1))
        return [Seed("ramp", np.concatenate([below, ramp]))]

    def seeds_from_file(self, path: str) -> list[Seed]:
        """A factors file's long factors, or another run's best; a run at another target length also gives its
        factors moved to this one as LongRoPE's dynamic form does, lambda' = 1 + (lambda - 1) (S' - 1) / (S - 1)
        (microsoft/LongRoPE, DynamicLongRoPEScaledRotaryEmbedding), which is how a progressive stage hands its
        best to the next."""
        seed = self.seed_from_file(path)
        other_length = _run_target_length(path)
        if other_length is None or other_length == self.target_length or other_length <= self.original_length:
            return [seed]
        ratio = (self.scale - 1) / (other_length / self.original_length - 1)
        moved = 1 + (seed.factors - 1) * ratio
        return [seed, Seed(f"{seed.name}@{self.target_length}", moved, seed.attention_factor)]

    def seed_from_file(self, path: str, field: str = "search.seed_files") -> Seed:
        """A factors JSON (what `longrope export` writes), or another run's directory (its best candidate)."""
        if Path(path).is_dir():
            factors, attention = _run_long_factors(RunDir(path))
            where = f"{field}: {path}: best candidate's factors"
        else:
            block = read_factors_file(path).rope_parameters
            factors, attention = np.asarray(block.long_factor, dtype=np.float64), block.attention_factor
            where = f"{field}: {path}: rope_parameters.long_factor"
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


def _run_target_length(path: str) -> int | None:
    """The target length of a run directory (None for a factors file)."""
    return RunDir(path).read_config().target_length if Path(path).is_dir() else None


def _run_long_factors(run_dir: RunDir) -> tuple[np.ndarray, float | None]:
    """A run's long factors and attention factor: its best candidate's; a progressive job's last stage's; a
    short-factor run's kept long factors (its candidates are short factors)."""
    if run_dir.read_config().search.stages:
        run_dir = last_stage(run_dir)
    job = read_job_record(run_dir) if run_dir.file(JOB_FILE).is_file() else None
    if job is not None and job.factor == "short":
        return np.asarray(job.long_factor, dtype=np.float64), job.attention_factor
    best = run_dir.best_record()
    return np.asarray(best["factors"], dtype=np.float64), best["attention_factor"]
