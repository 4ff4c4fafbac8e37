"""What a job resolves from its config before any scoring: the model's RoPE, lengths, tokenizer, windows,
the baseline methods and the search seeds. Every check that can fail on bad input runs here, first."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longrope.encodings import LongRope, RopeMethod
from longrope.encodings.baselines import baseline_methods, tuned_names, tuned_row
from longrope.search.config.factors_file import read_factors_file
from longrope.search.config.job_config import JobConfig, check_lengths_message
from longrope.search.config.strict import JobConfigError
from longrope.search.config.tuning_grids import TUNING_GRIDS
from longrope.search.job.seed_sources import distinct_seeds, is_model_config, run_long_factors, run_target_length
from longrope.search.job.tuning_grid import method_grid
from longrope.search.job.validation_checks import (
    check_seed_factors,
    file_checks_of,
    validation_check,
    window_supply_checks,
)
from longrope.search.optimizers.genome import SearchSpace, Seed, resolve_space
from longrope.search.run.job_record import RopeShape
from longrope.search.run.run_store import RunDir
from longrope.workers.device_plan import spans_gpus
from longrope.workers.documents import TextDocument, read_source
from longrope.workers.errors import DataError, WindowsCacheError
from longrope.workers.families import load_overrides, window_problem
from longrope.workers.models import check_model, model_rope, read_config_file, read_model_config, rope_with_overrides
from longrope.workers.specs import ModelSpec, PoolSpec
from longrope.workers.tokenization import BYTE_TOKENIZER, TextTokenizer
from longrope.workers.windows import Windows, interleave_windows, load_windows

# Rows, one per tuned closed form (`tuned_names`), that take its per-pair factors with LongRoPE's default attention
# factor, sqrt(1 + ln s / ln L0) (Ding et al. 2024, as transformers' `_compute_longrope_parameters` applies it; 1.0742
# at 4x of 8k), in place of the method's own (NTK-aware: none; YaRN: 0.1 ln s + 1), at every length (the short factors
# are the same factors, as the closed forms apply theirs below the original length too). A searched LongRoPE row
# carries that attention factor, so these rows tell what the searched per-pair factors win from what the attention
# factor alone wins.
# `search.seeds` names that stand for a tuned closed form's grid: {"ntk_tuned": "ntk", ...}
TUNED_SEEDS = {tuned_row(name): name for name in tuned_names()}
# compare's row and the seed for a model's own RoPE scaling moved to the target (models that ship one)
OWN_SCALING = "own"
SHIPPED = "none"  # the closed form "none" is the model as its config.json runs it (its own scaling, or plain RoPE)
LONGROPE_ATTENTION_ROWS = {f"{name}_longrope_attention": name for name in tuned_names()}


@dataclass
class JobContext:
    config: JobConfig
    model_dir: Path
    original_length: int
    method: RopeMethod  # the model's own RoPE (its theta, head_dim, partial rotary)
    tokenizer: TextTokenizer
    # what each worker loads the model with: `model.sliding_window: full`'s window off, then model.config_overrides
    model_overrides: dict = field(default_factory=dict)
    # the length the model serves as shipped: above original_length for a model whose config scales its RoPE
    serving_length: int | None = None
    _seeds: list[Seed] | None = field(default=None, init=False, repr=False)
    _kept_long: Seed | None = field(default=None, init=False, repr=False)
    # each source's documents, read once per job: compare cuts several window sets (lengths x objectives) from one
    _documents: dict[str, list[TextDocument]] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def resolve(cls, config: JobConfig) -> JobContext:
        model_dir = config.model.directory()
        try:
            file_config = read_model_config(model_dir)
            model_rope(file_config)
        except ValueError as exc:
            raise JobConfigError(f"model.path: {exc}") from exc
        rope = rope_with_overrides(file_config, config.model.config_overrides)  # a bad override is named
        original = config.original_length or rope.original_length
        if original > rope.original_length:
            raise JobConfigError(
                f"original_length: {original}, but the model at {config.model.path!r} was pre-trained at "
                f"{rope.original_length} tokens (its config.json); a config for another model?"
            )
        if config.target_length <= original:
            raise JobConfigError(check_lengths_message(original, config.target_length))
        if rope.shipped_scaling is not None and config.target_length <= rope.serving_length:
            raise JobConfigError(
                f"target_length: {config.target_length}, but the model already serves {rope.serving_length} tokens "
                f"with its own {rope.method.rope_type} scaling (config.json); ask for more than it serves"
            )
        window = window_problem(file_config, config.target_length, config.model.sliding_window)
        if window:
            raise JobConfigError(window)
        overrides = load_overrides(config.model.config_overrides, config.model.sliding_window, file_config)
        tokenizer = TextTokenizer(tokenizer_source(config, model_dir), trust_remote_code=config.model.trust_remote_code)
        serving = rope.serving_length if rope.shipped_scaling is not None else None
        return cls(config, model_dir, original, rope.method, tokenizer, overrides, serving)

    @property
    def target_length(self) -> int:
        return self.config.target_length

    @property
    def shipped_scaling(self) -> RopeMethod | None:
        """The model's own RoPE scaling (None for plain RoPE): what it runs today, up to `serving_length`."""
        return self.method if self.serving_length is not None else None

    @property
    def start_length(self) -> int:
        """Where the extension starts: the length the model serves today (its own scaling's), else the original."""
        return self.serving_length or self.original_length

    def lengths(self) -> dict[str, int]:
        """The lengths `validate --json` reports: the original, and the serving length of a model that ships
        scaling (where its extension starts)."""
        serving = {} if self.serving_length is None else {"serving_length": self.serving_length}
        return {"original_length": self.original_length, **serving}

    def start_text(self) -> str:
        """Where the extension starts, in words: "original_length (8192)", or for a model that ships scaling "the
        1024 tokens it serves (llama3 scaling; pre-trained at 256)"."""
        if self.serving_length is None:
            return f"original_length ({self.original_length})"
        return (
            f"the {self.serving_length} tokens it serves ({self.method.rope_type} scaling; pre-trained at "
            f"{self.original_length})"
        )

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
        if source not in self._documents:
            self._documents[source] = read_source(source, text_field=data.text_field)
        documents = self._documents[source]
        cache = Path(data.cache_dir) if data.cache_dir else Path(self.config.output_dir) / "windows-cache"
        try:
            return load_windows(
                documents,
                self.tokenizer,
                length=length + 1,
                count=count,
                seed=data.seed,
                cache_dir=cache if cached else None,
                objective=objective,
                original_length=self.original_length,
            )
        except WindowsCacheError as exc:  # named by the field that chose the folder: the user's own words
            if data.cache_dir:
                raise WindowsCacheError(f"data.cache_dir: {exc}") from exc
            raise WindowsCacheError(
                f"output_dir: {exc}; the cache goes under output_dir unless data.cache_dir is set"
            ) from exc

    def window_sources(self, source: str, windows: Windows) -> list[dict]:
        """Each window's document, offset and the document text's sha256, for job.json (read after `windows`)."""
        texts = {doc.name: doc.text for doc in self._documents.get(source) or read_source(source)}
        return [
            {"document": name, "offset": offset, "sha256": text_sha256(texts[name])}
            for name, offset in zip(windows.names, windows.offsets, strict=True)
        ]

    def objective_windows(self, source: str, length: int, count: int, *, cached: bool = True) -> Windows:
        """The job's windows for its objective mix: `count` per objective, in the order of `ObjectiveMix.of`.
        Perplexity and tail in one mix read the same documents twice."""
        weights = self.config.data.objective_weights()
        parts = [self.windows(source, length, count, objective, cached=cached) for objective in weights]
        return interleave_windows(parts)

    @property
    def shape(self) -> RopeShape:
        """The model's RoPE shape and the job's lengths, as job.json records them."""
        shipped = self.shipped_scaling
        return RopeShape(
            original_length=self.original_length,
            target_length=self.target_length,
            rope_theta=self.method.rope_theta,
            head_dim=self.method.head_dim,
            partial_rotary_factor=self.method.partial_rotary_factor,
            serving_length=self.serving_length,
            serving_factors=None if shipped is None else shipped.factors(self.serving_length).double().tolist(),
        )

    def longrope(
        self, factors, *, attention_factor: float | None = None, n_hat: int = 0, short_factor=None
    ) -> LongRope:
        return self.shape.longrope(factors, short_factor=short_factor, attention_factor=attention_factor, n_hat=n_hat)

    def baselines(self) -> dict[str, RopeMethod]:
        """The closed-form methods at their nominal settings for this job's scale, and NTK's and YaRN's factors with
        LongRoPE's attention factor instead of their own (`LONGROPE_ATTENTION_ROWS`). For a model that ships RoPE
        scaling, `none` is the model as its config.json runs it, and `own` is its scaling moved to the target as
        its method defines (`RopeMethod.moved_to`: Llama 3's factor times target / serving length)."""
        closed = baseline_methods(
            head_dim=self.method.head_dim,
            rope_theta=self.method.rope_theta,
            partial_rotary_factor=self.method.partial_rotary_factor,
            original=self.original_length,
            target=self.target_length,
        )
        borrowed = {}
        for row, source in LONGROPE_ATTENTION_ROWS.items():
            factors = closed[source].factors(self.target_length).double()
            borrowed[row] = self.longrope(factors, short_factor=factors)  # the closed form's factors at every length
        shipped = self.shipped_scaling
        own = {} if shipped is None else {SHIPPED: shipped, OWN_SCALING: shipped.moved_to(self.target_length)}
        return {**closed, **borrowed, **own}

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
        methods: dict[str, RopeMethod] = {}
        for name in [*self.config.search.seeds, *([OWN_SCALING] if self.shipped_scaling is not None else [])]:
            methods.update(self._tuned_seeds(name) if name in TUNED_SEEDS else {name: baselines[name]})
        seeds = [
            Seed(name, method.factors(self.target_length).double().numpy(), method.attention_factor)
            for name, method in methods.items()
        ]
        return distinct_seeds(seeds) + self._longrope2_ramp()

    def _tuned_seeds(self, name: str) -> dict[str, RopeMethod]:
        """A tuned closed form as seeds: the settings of its coarse tuning grid (the grid compare's `--tuning-grid
        coarse` scores), each named by its setting, "ntk_tuned (1.5, 1.1)". The search scores them in its first
        generation, so its best start is at least the tuned method compare will read. Where the attention factor is
        not searched (`attention_factor.mode: longrope`) a candidate carries LongRoPE's, so the grid's attention
        points would all be one candidate: one seed per scale then, "ntk_tuned (1.5,)"."""
        closed = TUNED_SEEDS[name]
        searched = self.config.search.attention_factor.mode == "searched"
        grid = method_grid(self, closed, TUNING_GRIDS["coarse"].line(closed).seed_grid(searched))
        return {f"{name} {setting if searched else setting[:1]}": method for setting, method in grid.items()}

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
        """A factors file's long factors, or another run's best; one searched for another target length also
        gives its factors moved to this one as LongRoPE's dynamic form does, lambda' = 1 + (lambda - 1) (S' - 1) /
        (S - 1) (microsoft/LongRoPE, DynamicLongRoPEScaledRotaryEmbedding): how a progressive stage hands its best
        to the next."""
        seed = self.seed_from_file(path)
        if is_model_config(path):
            return [seed]  # moved to this target already, as its own method defines
        other_length = run_target_length(path)
        if other_length == self.target_length or other_length <= self.original_length:
            return [seed]
        ratio = (self.scale - 1) / (other_length / self.original_length - 1)
        moved = 1 + (seed.factors - 1) * ratio
        return [seed, Seed(f"{seed.name}@{self.target_length}", moved, seed.attention_factor)]

    def seed_from_file(self, path: str, field: str = "search.seed_files") -> Seed:
        """A factors JSON (what `longrope export` writes), another run's directory (its best candidate), or a
        model's config.json (`config.json` by name): its RoPE scaling moved to this target."""
        if Path(path).is_dir():
            factors, attention = run_long_factors(RunDir(path))
            where = f"{field}: {path}: best candidate's factors"
        elif is_model_config(path):
            factors, attention = self._config_scaling(path, f"{field}: {path}")
            where = f"{field}: {path}: its RoPE scaling at {self.target_length} tokens"
        else:
            block = read_factors_file(path, f"{field}: {path}").rope_parameters
            factors, attention = np.asarray(block.long_factor, dtype=np.float64), block.attention_factor
            where = f"{field}: {path}: rope_parameters.long_factor"
        check_seed_factors(where, factors, self.pairs)
        return Seed(f"file:{Path(path).name}", factors, attention)

    def _config_scaling(self, path: str, where: str) -> tuple[np.ndarray, float]:
        """A model config's RoPE scaling (Llama 3.1's `llama3`, a `yarn` or `longrope` block) moved to this target
        (`RopeMethod.moved_to`) as per-pair factors over this model's frequencies, which it must share: the same
        rope_theta and rotary pairs."""
        try:
            method = model_rope(read_config_file(Path(path))).method
        except ValueError as exc:
            raise JobConfigError(f"{where}: {exc}") from exc
        if not math.isclose(method.rope_theta, self.method.rope_theta, rel_tol=1e-9):
            raise JobConfigError(
                f"{where}: rope_theta {method.rope_theta:g}, this job's model has {self.method.rope_theta:g}; "
                "its scaling divides other frequencies"
            )
        moved = method.moved_to(self.target_length)
        return moved.factors(self.target_length).double().numpy(), moved.attention_factor

    def validation_checks(self, file_checks: list[dict] | None = None) -> list[dict]:
        """`validate`: what resolving the job checked (model, lengths, seeds), then the data sources, read
        (`file_checks`: those already made, by `file_checks` before the model was resolved)."""
        seeds = self.seeds()
        self.check_model()  # what `search` checks before any worker starts: validate promises no later surprise
        return [
            validation_check("config", None, "ok", "fields, types, ranges and cross-field rules"),
            validation_check(
                "model.path",
                self.config.model.path,
                "ok",
                "config.json read (RoPE), tokenizer loaded, model built on the meta device (no weights read)",
            ),
            validation_check("lengths", self.target_length, "ok", f"target_length > {self.start_text()}"),
            validation_check("search.seeds", [seed.name for seed in seeds], "ok", "seeds and seed files resolved"),
            *(file_checks if file_checks is not None else file_checks_of(self.config)),
            *window_supply_checks(
                self.config, self.tokenizer, search_length=self.search_length + 1, test_length=self.target_length + 1
            ),
        ]

    def check_model(self) -> None:
        """Load-check the model in the driver (meta device, no weights read) before any worker starts; the
        device is checked only for the embedded Ray, whose workers share this machine."""
        model = self.config.model
        check_model(
            self.model_dir,
            device=model.device,
            attn_implementation=model.attn_implementation,
            trust_remote_code=model.trust_remote_code,
            config_overrides=dict(self.model_overrides),
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
            config_overrides=dict(self.model_overrides),
            candidates_per_forward=workers.candidates_per_forward,
            checkpoints=workers.checkpoints,
            gpus=int(workers.num_gpus_per_worker) if spans_gpus(workers.num_gpus_per_worker) else 1,
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
            retries=workers.retries,
            max_restarts=workers.max_restarts,
            restart_timeout_s=workers.restart_timeout_s,
            accelerator_type=workers.accelerator_type,
        )


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def tokenizer_source(config: JobConfig, model_dir: Path) -> str | Path:
    """Where the job's tokenizer comes from: `data.tokenizer` "bytes" (and always for the byte-level reference
    model), "model" (the model directory), or a directory of its own."""
    choice = config.data.tokenizer
    if choice == BYTE_TOKENIZER or config.model.is_reference:
        return BYTE_TOKENIZER
    if choice == "model":
        return model_dir
    if not Path(choice).is_dir():
        raise DataError(f"data.tokenizer: {choice!r} is neither 'model', 'bytes' nor a tokenizer directory")
    return Path(choice)
