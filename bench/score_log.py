"""The score log of bench/real_model.py's tables: every (set, length, method, window) score as one JSON line, appended
as it lands, so a table of hundreds of multi-minute forwards resumes across sessions where it stopped; and its setup
record (`LogSetup`), so a score is reused only under the model, dtype and data it was scored with.

One writer at a time (`flock`): a table and bench/search_split.py on one log would interleave lines and write the
setup record over with their own labels. A reader (`table --partial`) takes no lock and writes nothing, so it can
build the table of the windows scored so far while a table is still adding to the log.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

from pydantic import BaseModel

from longrope.encodings.rope_methods.batch import candidate_rows
from longrope.search.job.job_context import JobContext


class LogSetup(BaseModel):
    """The score log's setup record (smollm2_16k_scores.setup.json beside it): what its scores were scored with. A log
    is added to and read only under the same setup, so a re-exported factors file at the same path, another dtype,
    model or data seed can never borrow another setup's scores (the rows' keys name a method by its label alone)."""

    model: str  # the converted model's GGUF sha256 (provenance.json), else its directory
    dtype: str
    attn_implementation: str
    original_length: int
    target_length: int
    data_seed: int
    search_source: str
    test_source: str
    methods: dict[str, str] = {}  # label -> the method's fingerprint (`fingerprint`)

    @classmethod
    def of(cls, context: JobContext) -> LogSetup:
        config, provenance_file = context.config, Path(context.model_dir) / "provenance.json"
        model = json.loads(provenance_file.read_text())["gguf_sha256"] if provenance_file.is_file() else None
        return cls(
            model=model or str(context.model_dir),
            dtype=config.model.dtype,
            attn_implementation=config.model.attn_implementation,
            original_length=context.original_length,
            target_length=context.target_length,
            data_seed=config.data.seed,
            search_source=config.data.search_source,
            test_source=config.data.test_source,
        )


def applied(method, length: int) -> bytes:
    """What a forward of `length` tokens applies: the frequencies in force, the attention factor and n_hat, as the
    scorer stacks them (`candidate_rows`)."""
    rows = candidate_rows([method], length)
    return b"".join(t.numpy().tobytes() for t in (rows.inv_freq, rows.attention_factor, rows.n_hat))


def fingerprint(method) -> str:
    """A method's identity: its class and every field (the factors, theta, attention factor...)."""
    payload = type(method).__name__ + method.model_dump_json()
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class ScoreLog:
    """The append-only log of scores: {(set, length, method, window id): (nll sum, tokens)}, and its setup record."""

    def __init__(self, path: Path, setup: LogSetup, read_only: bool = False):
        """`read_only`: read the log as it stands (another run may be adding to it), take no lock, write nothing."""
        self.path, self.scores, self.read_only = path, {}, read_only
        self.setup_path = path.with_name(path.stem + ".setup.json")
        if read_only and not path.is_file():
            raise SystemExit(f"{path}: no score log yet; run the table without --partial first")
        self._held = None if read_only else self._hold()
        self.setup = self._checked_setup(setup)
        for line in self._whole_lines():
            row = json.loads(line)
            self.scores[(row["set"], row["length"], row["method"], row["window"])] = (row["nll"], row["tokens"])

    def _whole_lines(self) -> list[str]:
        """The log's lines. A last line without its newline is a line cut by a kill mid-write (the next line would
        run on from it: dropped, with a warning), or one whose newline alone was lost (a hand merge: kept, and the
        newline put back); a reader leaves it as it is (the writer may be mid-line) and reads it only if whole."""
        data = self.path.read_bytes()
        whole, tail = data[: data.rfind(b"\n") + 1], data[data.rfind(b"\n") + 1 :]
        lines = whole.decode().splitlines()
        if not tail:
            return lines
        try:
            json.loads(tail)
        except ValueError:
            if not self.read_only:
                print(f"warning: {self.path}: dropping its torn last line {tail[:80]!r}")
                os.truncate(self.path, len(whole))
            return lines
        if not self.read_only:
            with self.path.open("a") as out:
                out.write("\n")
        return [*lines, tail.decode()]

    def _hold(self):
        """One writer per log, held until the process ends (the kernel drops the lock however it ends): a second run
        on the same log (a table beside search_split.py) would interleave its lines and write the setup record over
        with its own labels."""
        held = self.path.open("a")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.close()
            raise SystemExit(f"{self.path}: in use by another bench run on this log; wait for it to end") from None
        return held

    def _checked_setup(self, setup: LogSetup) -> LogSetup:
        if not self.setup_path.is_file():
            if self.read_only:
                return setup
            if self.path.stat().st_size:
                print(f"warning: {self.path} has no setup record; taking it as this run's: {setup.model_dump()}")
            self.setup_path.write_text(setup.model_dump_json(indent=1) + "\n")
            return setup
        recorded = LogSetup.model_validate_json(self.setup_path.read_text())
        for field, value in setup.model_dump(exclude={"methods"}).items():
            if getattr(recorded, field) != value:
                raise SystemExit(
                    f"{self.path}: scored with {field} = {getattr(recorded, field)!r}, this run has {value!r}; "
                    "give --results another folder for another setup"
                )
        return recorded

    def check_methods(self, methods: dict) -> None:
        """Each label names the method the log's scores of it were scored with (recorded on first use)."""
        for label, method in methods.items():
            known = self.setup.methods.setdefault(label, fingerprint(method))
            if known != fingerprint(method):
                raise SystemExit(
                    f"{self.path}: its scores of {label!r} are of another method than this run's (a new export at "
                    "the same path?); give --results another folder"
                )
        if not self.read_only:
            self.setup_path.write_text(self.setup.model_dump_json(indent=1) + "\n")

    def add(self, key: tuple, nll: float, tokens: int, seconds: float) -> None:
        if self.read_only:
            raise RuntimeError(f"{self.path}: read only; a score was about to be written")
        self.scores[key] = (nll, tokens)
        kind, length, method, window = key
        row = {"set": kind, "length": length, "method": method, "window": window, "nll": nll, "tokens": tokens}
        with self.path.open("a") as out:
            out.write(json.dumps({**row, "seconds": round(seconds, 1)}) + "\n")

    def copied_twin(self, key: tuple, methods: dict) -> str | None:
        """Log, under `key`, the score of a method that applies the same numbers on the same set, length and window,
        instead of scoring it again; that method's label, or None where there was none. The same numbers: a label of
        the same fingerprint, of this run or recorded before (a tuned pick logged under its bare name by older code),
        or a method of this run whose frequencies and attention factor in force at that length are equal (`applied`:
        tuned YaRN's pick is often YaRN itself, or YaRN's factors with LongRoPE's attention factor, a LongRope of
        another fingerprint)."""
        kind, length, label, window = key
        mine = applied(methods[label], length)
        for other, known in self.setup.methods.items():
            twin = (kind, length, other, window)
            if other == label or twin not in self.scores:
                continue
            if known == self.setup.methods[label] or (other in methods and applied(methods[other], length) == mine):
                self.add(key, *self.scores[twin], seconds=0.0)
                return other
        return None

    def means(self, kind: str, length: int, method: str, ids: list[str]) -> list[float] | None:
        """Mean NLL per token of each window, or None while any is missing."""
        found = [self.scores.get((kind, length, method, w)) for w in ids]
        return None if None in found else [nll / tokens for nll, tokens in found]
