"""The job config: one strict pydantic model, loaded from YAML, every field overridable from the command line.

Bad input stops here, before any model is loaded, with one line per problem naming the field and the value.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from longrope.search.config.yaml_reader import ConfigYamlError, parse_yaml, read_yaml
from longrope.workers.devices import device_problem
from longrope.workers.objective_names import OBJECTIVES
from longrope.workers.path_limits import RUN_DIR_ROOM, SHOWN_CHARACTERS, path_length_problem, shown_path
from longrope.workers.reference_recipe import REFERENCE_MODEL_DIR

SEED_METHODS = ("pi", "ntk", "yarn", "llama3")
MAX_LENGTH = 1 << 26  # 67M tokens: past every published context window, far below int32/int64 trouble
MAX_SEED = (1 << 63) - 1  # numpy's PCG64 takes a non-negative integer
MAX_COUNT = 1_000_000  # populations, generations, windows: larger is a typo, not a job
MIN_GRID_STEP = 1e-4  # factors live on an integer grid: (max_factor / grid_step) steps must stay countable
MAX_FACTOR = 1e4
N_HAT_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
REFERENCE_MODEL = "reference"  # model.path naming the reference model that ships with the package


class JobConfigError(ValueError):
    """A job config (file, override or resolved value) is invalid; the message names every bad field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def _os_path(value: str, room: int = 0) -> str:
    """A path field the OS will take (workers/path_limits.py): refused here, before anything is opened or written."""
    problem = path_length_problem(value, room=room)
    if problem:
        raise ValueError(problem)
    return value


PathText = Annotated[str, AfterValidator(_os_path)]


class ModelConfig(Strict):
    path: PathText = Field(
        default=REFERENCE_MODEL, description='a local model directory, or "reference" for the shipped reference model'
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
        "{sliding_window: null}; a mapping given with --set replaces this one whole",
    )

    @property
    def is_reference(self) -> bool:
        return self.path == REFERENCE_MODEL

    def directory(self) -> Path:
        """The model's directory: the reference model's inside the installed package, or `path` as given."""
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


class NHatConfig(Strict):
    enabled: bool = Field(
        default=False,
        description="search n_hat, the first positions kept un-scaled (off: transformers and vLLM cannot express it)",
    )
    choices: tuple[int, ...] = Field(default=N_HAT_CHOICES, description="the n_hat values the search may pick")

    @field_validator("choices")
    @classmethod
    def _non_negative(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 0:
            raise ValueError(f"must be non-empty and >= 0, got {list(value)}")
        return tuple(sorted(set(value)))


class AttentionFactorConfig(Strict):
    mode: Literal["longrope", "searched"] = Field(
        default="longrope",
        description="longrope: transformers' formula, sqrt(1 + ln(s) / ln(original_length)); searched: a searched gene",
    )
    low: float = Field(default=1.0, gt=0, le=100, description="the searched attention factor's lower bound")
    high: float = Field(default=1.6, gt=0, le=100, description="the searched attention factor's upper bound")
    step: float = Field(default=0.01, ge=MIN_GRID_STEP, le=1, description="the searched attention factor's grid step")

    @model_validator(mode="after")
    def _ordered(self) -> AttentionFactorConfig:
        if self.high < self.low:
            raise ValueError(f"high: must be >= low ({self.low}), got {self.high}")
        return self


class EarlyStopConfig(Strict):
    patience: int | None = Field(
        default=None, ge=1, description="stop after this many generations without improvement; null: never early"
    )
    min_improvement: float = Field(
        default=0.001, ge=0, description="what counts as an improvement, in mean NLL (nats per token)"
    )


class RacingConfig(Strict):
    """Stop scoring a child once it is clearly worse than the worst parent, paired on the same windows.

    After each group of `group_windows` windows (after at least `min_windows`), with d_j the child's per-token NLL
    minus the worst parent's on window j: stop when mean(d) - z * sd(d) / sqrt(k) > 0 (a one-sided paired bound).
    """

    enabled: bool = Field(
        default=False, description="stop scoring a child once it is clearly worse than the worst parent"
    )
    z: float = Field(default=2.0, ge=0, le=10, description="how clearly: the one-sided bound's z, in standard errors")
    min_windows: int = Field(
        default=3, ge=2, le=MAX_COUNT, description="windows scored before a child may be stopped (a paired sd needs 2)"
    )
    group_windows: int = Field(default=1, ge=1, le=MAX_COUNT, description="windows scored between two looks")


class CmaesConfig(Strict):
    """CMA-ES (the `cma` package) over log-increments of the factors; see search/optimizers/cmaes.py."""

    sigma: float = Field(default=0.05, gt=0, le=10, description="CMA-ES's initial step size, in log-factor units")
    population: int | None = Field(
        default=None, ge=2, le=MAX_COUNT, description="CMA-ES samples per generation; null: mutations + crossovers"
    )


class GradientConfig(Strict):
    """Gradient descent on the factors (search/optimizers/gradient.py): perplexity is smooth in every factor, so one
    backward pass gives the gradient for all pairs. The factors are parametrized so that every step satisfies the
    official constraints (non-decreasing across pairs, within [1, max_factor]; the attention factor within its bounds),
    the search windows are split into the gradient's and `holdout_windows` held out for the stopping rule, and every
    step's point is scored on all of them (a candidate in history.jsonl like any other). Adam (Kingma and Ba 2015) with
    the default betas. `hybrid` polishes the evolution's best with `polish_steps` of it every `polish_every` generations
    and always once more when the evolution ends (its last generation, an early stop), unless that generation's best was
    just polished."""

    steps: int = Field(default=60, ge=0, le=MAX_COUNT, description="gradient steps after the seeds are scored")
    learning_rate: float = Field(default=0.15, gt=0, le=10, description="Adam's step size, in parameter units")
    windows_per_step: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="gradient windows per step, a block cycling through them; null: all of them every step",
    )
    holdout_windows: int = Field(
        default=2, ge=1, le=MAX_COUNT, description="search windows held out from the gradient (the stopping rule's)"
    )
    patience: int | None = Field(
        default=10, ge=1, le=MAX_COUNT, description="stop after this many steps without a held-out gain; null: never"
    )
    min_improvement: float = Field(
        default=1e-4, ge=0, description="a held-out gain, in mean NLL (nats per token), that resets the patience"
    )
    polish_every: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        description="hybrid: polish the evolution's best every this many generations; its final best always; "
        "null: the final best only",
    )
    polish_steps: int = Field(default=10, ge=1, le=MAX_COUNT, description="hybrid: gradient steps per polish")
    polish_learning_rate: float = Field(default=0.05, gt=0, le=10, description="hybrid: Adam's step size to polish")

    def polishes(self, generations: int) -> int:
        """The hybrid's polishes in a run of `generations` that is not stopped early: one after every
        polish_every-th generation, and one after the last if that is not such a generation already (an early
        stop ends with one polish too, so this is also the most a run can do)."""
        every = self.polish_every or generations + 1
        if generations == 0:
            return 0
        return generations // every + (generations % every != 0)


class SearchConfig(Strict):
    population: int = Field(default=64, ge=2, le=MAX_COUNT, description="candidates in generation 0")
    generations: int = Field(default=40, ge=0, le=MAX_COUNT, description="generations after generation 0")
    parents: int = Field(default=32, ge=1, le=MAX_COUNT, description="the best candidates kept as parents")
    mutations: int = Field(default=16, ge=0, le=MAX_COUNT, description="children by mutation, per generation")
    crossovers: int = Field(default=16, ge=0, le=MAX_COUNT, description="children by crossover, per generation")
    change_probability: float = Field(
        default=0.3, gt=0, le=1, description="the chance that a mutation changes each factor"
    )
    grid_step: float = Field(
        default=0.01, ge=MIN_GRID_STEP, le=1, description="factors live on this grid (a candidate's identity)"
    )
    max_factor: float | None = Field(
        default=None, gt=1, le=MAX_FACTOR, description="the largest factor; null: 1.25 x target/original (the paper)"
    )
    seeds: tuple[Literal["pi", "ntk", "yarn", "llama3"], ...] = Field(
        default=("pi", "ntk", "yarn"), description="closed forms at the target that start the population"
    )
    seed_files: tuple[PathText, ...] = Field(
        default=(), description="more seeds: factors JSON files (what `longrope export` writes) or other runs' dirs"
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="the optimizer's random seed")
    n_hat: NHatConfig = Field(default=NHatConfig(), description="section: n_hat, the un-scaled first positions")
    attention_factor: AttentionFactorConfig = Field(
        default=AttentionFactorConfig(), description="section: the attention factor (temperature)"
    )
    early_stop: EarlyStopConfig = Field(default=EarlyStopConfig(), description="section: stopping early")
    optimizer: Literal["dim_mono", "cmaes", "gradient", "hybrid"] = Field(
        default="dim_mono",
        description="dim_mono: the LongRoPE release's evolution; cmaes: CMA-ES (search/optimizers/cmaes.py); "
        "gradient: descent on the factors (search/optimizers/gradient.py); hybrid: dim_mono with its best polished by "
        "gradient steps",
    )
    schedule: Literal["generational", "steady"] = Field(
        default="generational",
        description="generational: parents chosen once per generation; steady: after every scored child",
    )
    racing: RacingConfig = Field(default=RacingConfig(), description="section: racing children on paired windows")
    cmaes: CmaesConfig = Field(default=CmaesConfig(), description="section: CMA-ES settings")
    gradient: GradientConfig = Field(
        default=GradientConfig(), description="section: gradient descent settings (optimizer gradient or hybrid)"
    )
    space: Literal["longrope", "longrope2"] = Field(
        default="longrope",
        description="longrope: every pair searched; longrope2: only pairs >= the critical dimension, within "
        "[target/original, length_scale], the pairs below set from the critical pair (LongRoPE2, arXiv 2502.20082)",
    )
    critical_dim: int | None = Field(
        default=None, ge=0, le=MAX_COUNT, description="longrope2's critical pair; null: ceil(log_theta(L0/2pi) d/2) - 1"
    )
    length_scale: float | None = Field(
        default=None, gt=1, le=MAX_FACTOR, description="longrope2's largest factor; null: 2 x target/original"
    )
    factor: Literal["long", "short"] = Field(
        default="long",
        description="long: the factors used past original_length; short: those used up to it (Phi-3), searched on "
        "windows of original_length tokens with long_factors kept",
    )
    long_factors: PathText | None = Field(
        default=None, description="the long factors a short-factor search keeps: a factors file or a run directory"
    )
    stages: tuple[int, ...] = Field(
        default=(), description="progressive search: shorter target lengths first, each seeding the next"
    )

    @field_validator("stages")
    @classmethod
    def _increasing(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        for first, second in itertools.pairwise(value):
            if second <= first:
                raise ValueError(f"stage lengths must increase, got {first} then {second}")
        return value

    @model_validator(mode="after")
    def _sizes(self) -> SearchConfig:
        if self.optimizer == "cmaes" and self.space == "longrope2":
            raise ValueError("space: 'longrope2' needs optimizer 'dim_mono' (CMA-ES searches every pair)")
        if self.factor == "short" and not self.long_factors:
            raise ValueError("long_factors: factor 'short' needs the long factors it keeps (a factors file or run)")
        if self.factor == "short" and self.attention_factor.mode == "searched":
            raise ValueError(
                "attention_factor.mode: a short-factor search keeps the long factors' attention factor (transformers "
                "applies it in both regimes); use 'longrope'"
            )
        if self.factor == "short" and self.space == "longrope2":
            raise ValueError("space: a short-factor search needs 'longrope' (longrope2's bounds start at the scale)")
        if self.factor == "short" and self.stages:
            raise ValueError(f"stages: a short-factor search has one length (original_length), got {list(self.stages)}")
        if self.optimizer == "cmaes" and self.schedule == "steady":
            raise ValueError("schedule: 'steady' needs optimizer 'dim_mono' (CMA-ES updates once per generation)")
        if self.optimizer == "cmaes" and self.racing.enabled:
            raise ValueError("racing.enabled: racing needs optimizer 'dim_mono' (CMA-ES ranks every sample)")
        if self.optimizer == "cmaes" and self.n_hat.enabled:
            raise ValueError("n_hat.enabled: CMA-ES searches factors and the attention factor only, not n_hat")
        self._gradient_rules()
        if self.parents > self.population:
            raise ValueError(f"parents: must be <= population ({self.population}), got {self.parents}")
        if self.mutations + self.crossovers < 1:
            raise ValueError("mutations: mutations + crossovers must be at least 1, got 0")
        if self.factor == "long" and not self.seeds and not self.seed_files:
            raise ValueError(
                "seeds: a population needs at least one seed: name a closed form (pi, ntk, yarn, llama3) or give "
                "search.seed_files, got []"
            )
        return self

    def _gradient_rules(self) -> None:
        """What descent cannot do: n_hat moves positions between regimes (not differentiable; a GA-only gene),
        longrope2's derived pairs and a short-factor search's regime are not parametrized, racing and the steady
        schedule are the evolution's."""
        if self.optimizer not in ("gradient", "hybrid"):
            return
        rules = (
            (self.n_hat.enabled, "n_hat.enabled: n_hat is not differentiable, a gene of dim_mono only"),
            (self.space != "longrope", "space: gradient descent searches every pair ('longrope')"),
            (self.factor != "long", "factor: gradient descent searches the long factors"),
            (self.racing.enabled, "racing.enabled: racing is dim_mono's; descent scores every window of a step"),
            (self.schedule != "generational", "schedule: 'steady' needs optimizer 'dim_mono'"),
        )
        for broken, message in rules:
            if broken:
                raise ValueError(f"{message} (optimizer {self.optimizer!r})")


class WorkersConfig(Strict):
    address: str | None = Field(
        default=None, description='null: an embedded local Ray; "auto" or "ray://host:10001": a running cluster'
    )
    num_workers: int = Field(default=1, ge=1, le=100_000, description="Ray actors, each with its own model copy")
    num_gpus_per_worker: float = Field(default=0.0, ge=0, le=1024, description="GPUs per worker (may be fractional)")
    num_cpus_per_worker: float = Field(default=1.0, gt=0, le=1024, description="CPUs per worker (may be fractional)")
    candidates_per_forward: int = Field(
        default=4, ge=1, le=MAX_COUNT, description="candidates scored in one forward pass (as extra batch rows)"
    )
    batch_size: int = Field(default=4, ge=1, le=MAX_COUNT, description="candidates per call to a worker")
    local_num_cpus: int | None = Field(
        default=None, ge=1, le=100_000, description="CPUs the embedded Ray may use; null: all"
    )

    @field_validator("num_gpus_per_worker", "num_cpus_per_worker")
    @classmethod
    def _ray_amount(cls, value: float) -> float:
        return ray_resource_amount(value)


def ray_resource_amount(value: float) -> float:
    """Ray refuses a fractional resource below 0.0001 (`.options()` raises "The precision of the fractional
    quantity of resource ... cannot go beyond 0.0001"); refuse it here, before anything is written."""
    if 0 < value < 1e-4:
        raise ValueError(f"must be 0 or at least 0.0001 (Ray's precision for resources), got {value}")
    return value


LATER_SEARCH_FIELDS = (
    "gradient",
    "optimizer",
    "schedule",
    "racing",
    "cmaes",
    "space",
    "critical_dim",
    "length_scale",
    "factor",
    "long_factors",
    "stages",
)
LATER_DATA_FIELDS = ("objective",)


class JobConfig(Strict):
    name: str = Field(default="longrope-search", description="the job's name, in logs and status")
    model: ModelConfig = Field(default=ModelConfig(), description="section: the model and how workers load it")
    data: DataConfig = Field(default=DataConfig(), description="section: documents, tokenizer, windows, objective")
    original_length: int | None = Field(
        default=None, ge=2, le=MAX_LENGTH, description="the length the model was trained at; null: read from its config"
    )
    target_length: int = Field(ge=2, le=MAX_LENGTH, description="the length the factors are searched for")
    search: SearchConfig = Field(default=SearchConfig(), description="section: the search")
    workers: WorkersConfig = Field(default=WorkersConfig(), description="section: where candidates are scored")
    output_dir: str = Field(
        default="runs/job",
        min_length=1,
        description="the run directory: config.json, job.json, history.jsonl, state.json, the windows cache",
    )

    @field_validator("output_dir")
    @classmethod
    def _a_path(cls, value: str) -> str:
        if not value.strip() or "\x00" in value:
            raise ValueError("must name a directory (not blank, no NUL character)")
        return _os_path(value, room=RUN_DIR_ROOM)

    @model_validator(mode="after")
    def _lengths(self) -> JobConfig:
        if self.original_length is not None and self.target_length <= self.original_length:
            raise ValueError(check_lengths_message(self.original_length, self.target_length))
        n_hat = self.search.n_hat
        if n_hat.enabled and max(n_hat.choices) >= self.target_length:
            raise ValueError(
                f"search.n_hat.choices: every choice must be < target_length ({self.target_length}), "
                f"got {max(n_hat.choices)}"
            )
        if self.search.factor == "short" and "tail" in self.data.objective_weights():
            raise ValueError(
                "data.objective: 'tail' counts positions past original_length, and a short-factor search reads "
                "windows of original_length tokens"
            )
        stages = self.search.stages
        if stages and (stages[-1] >= self.target_length or stages[0] <= (self.original_length or 0)):
            bad = stages[-1] if stages[-1] >= self.target_length else stages[0]
            raise ValueError(
                f"search.stages: each stage length must lie between original_length ({self.original_length}) and "
                f"target_length ({self.target_length}), got {bad}"
            )
        gradient, windows = self.search.gradient, self.data.search_windows * len(self.data.objective_weights())
        if self.search.optimizer in ("gradient", "hybrid") and gradient.holdout_windows >= windows:
            raise ValueError(
                f"search.gradient.holdout_windows: must leave the gradient at least one of the {windows} search "
                f"windows, got {gradient.holdout_windows}"
            )
        if self.search.optimizer in ("gradient", "hybrid") and (gradient.windows_per_step or 0) > windows - (
            gradient.holdout_windows
        ):
            raise ValueError(
                f"search.gradient.windows_per_step: at most the {windows - gradient.holdout_windows} gradient windows "
                f"(search windows less holdout_windows), got {gradient.windows_per_step}"
            )
        racing = self.search.racing
        if racing.enabled and racing.min_windows >= self.data.search_windows:
            raise ValueError(
                f"search.racing.min_windows: must be < data.search_windows ({self.data.search_windows}) for racing "
                f"to stop anything, got {racing.min_windows}"
            )
        return self

    def hash(self) -> str:
        """Identity of a run: everything that changes its result (not where it is written or who scores it).

        Search fields added after the first release (LATER_SEARCH_FIELDS) count only when they differ from their
        defaults, so a run directory written before them still matches its config and can be resumed."""
        identity = self.model_dump(mode="json", exclude={"output_dir", "workers"})
        for section, names, defaults in (
            ("search", LATER_SEARCH_FIELDS, SearchConfig().model_dump(mode="json")),
            ("data", LATER_DATA_FIELDS, DataConfig().model_dump(mode="json")),
        ):
            for name in names:
                if identity[section][name] == defaults[name]:
                    del identity[section][name]
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def check_lengths_message(original_length: int, target_length: int) -> str:
    return f"target_length: must be greater than original_length ({original_length}), got {target_length}"


def describe_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            lines.append(f"{source}: {field}: required but missing")
        elif isinstance(error["input"], dict) and error["type"] == "value_error":
            prefix = "" if field == "(top level)" else f"{field}."
            lines.append(f"{source}: {prefix}{message}")  # a cross-field check: its message names field and value
        elif error["type"] == "extra_forbidden":
            lines.append(f"{source}: {field}: unknown field (value {shown_value(error['input'])})")
        else:
            lines.append(f"{source}: {field} = {shown_value(error['input'])}: {message}")
    return "\n".join(lines)


def shown_value(value: Any) -> str:
    """A value as an error line shows it: its repr, or a string too long to read (a 5,000-character path) cut in
    the middle as paths are (`shown_path`)."""
    return shown_path(value) if isinstance(value, str) and len(value) > SHOWN_CHARACTERS else repr(value)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`search.generations=10` -> (["search", "generations"], 10); the value is read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise JobConfigError(f"--set {text!r}: expected FIELD=VALUE, e.g. search.generations=10")
    try:
        parsed = parse_yaml(value)
    except ConfigYamlError as exc:
        raise JobConfigError(f"--set {key.strip()}: cannot read value {value[:80]!r} ({exc})") from None
    return key.strip().split("."), parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Each `--set FIELD=VALUE` in turn. A mapping given for a section (`search={population: 8}`) merges into what
    the file and earlier overrides set there, recursively; any other value, a mapping-valued field's included
    (`model.config_overrides`, `data.objective`), replaces the one before it."""
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise JobConfigError(f"--set {'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = merged_into(node.get(path[-1]), value, section_model(path))
    return raw


def merged_into(current: Any, value: Any, section: type[BaseModel] | None) -> Any:
    """`value` set over `current`: a mapping given for a section (a pydantic model field) keeps the section's other
    fields; nested sections merge the same way."""
    if section is None or not isinstance(value, dict) or not isinstance(current, dict):
        return value
    merged = dict(current)
    for key, item in value.items():
        merged[key] = merged_into(current.get(key), item, section_model([str(key)], section))
    return merged


def section_model(path: list[str], root: type[BaseModel] | None = None) -> type[BaseModel] | None:
    """The pydantic model of the section at `path` (`["search", "racing"]` -> RacingConfig), or None when the path
    names a plain field or nothing."""
    model = root or JobConfig
    for part in path:
        field = model.model_fields.get(part)
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def load_job_config(path: str | Path | None, overrides: list[str] = (), base: dict | None = None) -> JobConfig:
    """Read YAML (guarded safe_load), apply `--set` overrides (on `base` when no file is given), validate;
    JobConfigError lists every problem."""
    raw: dict[str, Any] = dict(base or {})
    source = str(path) if path else "config"
    if path is not None:
        check_config_file(Path(path), source)
        try:
            raw = read_yaml(Path(path)) or {}
        except ConfigYamlError as exc:
            raise JobConfigError(f"{source}: {exc}") from None
        except OSError as exc:
            raise JobConfigError(f"{source}: cannot read ({exc.strerror or exc})") from None
        if not isinstance(raw, dict):
            raise JobConfigError(f"{source}: expected a mapping of fields at the top level, got {type(raw).__name__}")
    raw = apply_overrides(raw, list(overrides))
    _reject_non_finite(raw, [])
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise JobConfigError(describe_errors(exc, source)) from None


def check_config_file(file: Path, source: str) -> None:
    """A config path names a regular file: not a directory, a device (`/dev/null`), a FIFO or a name too long."""
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise JobConfigError(f"{source}: no such config file") from None
    except OSError as exc:  # e.g. a name past NAME_MAX, or a folder on the way that is a file
        raise JobConfigError(f"{shown_path(source)}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise JobConfigError(f"{source}: is a directory, not a config file")
    if not stat.S_ISREG(mode):
        kind = "a character device" if stat.S_ISCHR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a file"
        raise JobConfigError(f"{source}: not a regular file ({kind}); give a YAML config file")


def _reject_non_finite(node: Any, path: list[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _reject_non_finite(value, [*path, str(key)])
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _reject_non_finite(value, [*path[:-1], f"{path[-1] if path else ''}[{index}]"])
    elif isinstance(node, float) and not math.isfinite(node):
        raise JobConfigError(f"{'.'.join(path)} = {node}: must be a finite number")
