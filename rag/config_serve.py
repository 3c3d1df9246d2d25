"""The serving sections of the settings: the HTTP service and its API keys, the answer cache,
the prompt-injection filter, A/B experiments between generator profiles, and routing."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ApiKeySettings(BaseModel):
    """One API key of the HTTP service, stored as a hash: ``ragqa keys create`` prints both.

    ``admin`` implies ``query``. A key with a ``tenant`` only ever retrieves that tenant's
    documents; admin keys see every tenant, so they cannot be bound to one.
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt field of a key must not pass silently

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Names the key in logs and metrics.")
    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="`ragqa keys hash KEY`; never the key itself.")
    scopes: tuple[Literal["query", "admin"], ...] = Field(default=("query",), min_length=1)
    tenant: str | None = Field(default=None, min_length=1)
    rate_limit_per_minute: int | None = Field(
        default=None, ge=0, description="This key's limit; default serve.rate_limit_per_minute; 0: none.")

    @model_validator(mode="after")
    def _admin_is_global(self) -> ApiKeySettings:
        if "admin" in self.scopes and self.tenant is not None:
            raise ValueError(f"api key {self.id!r}: an admin key cannot be bound to a tenant "
                             "(the admin routes see every tenant's documents)")
        return self


class ServeSettings(BaseModel):
    """The HTTP service: where it listens, its input limits, how long streams are kept, API keys."""

    auth: bool = Field(default=True, description="Require an API key; turn off only on loopback (a local demo).")
    api_keys: list[ApiKeySettings] = Field(default_factory=list)
    allow_insecure_public: bool = Field(
        default=False, description="Start on a non-loopback host with auth off anyway (ragqa serve --allow-insecure).")
    rate_limit_per_minute: int = Field(
        default=120, ge=0, description="Requests per minute per key (per client IP with auth off); 0: no limit.")
    rate_limit_storage: str | None = Field(
        default=None, description="memory:// (each worker counts alone) or redis://host:6379/0 (shared by "
        "workers and instances); default: serve.redis_url when set, else memory://.")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Largest request body; more is a 413.")
    max_in_flight: int | Literal["auto"] | None = Field(default="auto", description=(
        "Answers retrieved and generated at once per worker (cache hits do not count). auto: the CPU cores "
        "with a generator in this process (llamacpp, extractive), 32 with a generator server (vllm, openai); "
        "null: no bound."))
    max_queued: int | Literal["auto"] = Field(default="auto", description=(
        "Questions that wait for an answer slot per worker; past it a 503 with Retry-After, at once. "
        "auto: as many as max_in_flight (a deeper queue only makes the accepted answers wait: "
        "bench/RESULTS-overload.md)."))
    retry_after_s: float = Field(default=2.0, gt=0, description="The Retry-After of an overload 503.")
    max_in_flight_global: int | None = Field(default=None, ge=1, description=(
        "Answers generated at once across every worker and instance that share serve.redis_url (a lease in "
        "Redis per answer, on top of each worker's max_in_flight); past it a 503 at once. Size it to what the "
        "shared generator serves (a vLLM server's batch). null: no global bound. With Redis down, each worker's "
        "own bound still holds."))
    admission_lease_s: float = Field(default=300.0, gt=0, description=(
        "A global answer slot whose worker died is freed after this long."))

    @field_validator("max_in_flight", "max_queued")
    @classmethod
    def _bounds(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("must be >= 0 (or auto)")
        return value
    max_question_chars: int = Field(default=4000, ge=1, description="Longest question (the last user message).")
    max_messages: int = Field(default=50, ge=1, description="Most messages in one chat request.")
    stream_retention_s: float = Field(
        default=300, gt=0, description="Keep a stream's events this long after its last one, for resume.")
    disconnect_grace_s: float = Field(
        default=30, gt=0, description="Abort a generation whose client has been gone this long.")
    redis_url: str | None = Field(
        default=None, description="redis://host:6379/0: keep streams and /v1/ask conversations in Redis, so a "
        "client resumes or continues on any worker or instance (and the answer cache's default Redis); default: "
        "this process's memory.")
    conversation_ttl_s: float = Field(default=86_400.0, gt=0, description=(
        "With serve.redis_url: a /v1/ask conversation is kept this long after its last turn (in memory: the "
        "10,000 most recently used)."))
    qa_log: bool = Field(default=True, description="Log each question and answer as a JSON line (secrets redacted).")
    qa_log_path: Path | None = Field(
        default=None, description="Where; default <data_dir>/logs/qa.jsonl (qa-{pid}.jsonl with several workers). "
        "'{pid}' becomes the process id: rotation is per process, so give each worker its own file.")
    qa_log_max_bytes: int = Field(default=10_000_000, ge=1024, description="Rotate the QA log at this size.")
    qa_log_backups: int = Field(default=5, ge=1, le=1000, description="Rotated QA log files kept (qa.jsonl.1, ...).")

    @model_validator(mode="after")
    def _global_needs_redis(self) -> ServeSettings:
        if self.max_in_flight_global is not None and not self.redis_url:
            raise ValueError("serve.max_in_flight_global needs serve.redis_url (the workers share the bound there)")
        return self

    @model_validator(mode="after")
    def _unique_keys(self) -> ServeSettings:
        for what in ("id", "hash"):
            seen = [getattr(k, what) for k in self.api_keys]
            dup = next((v for v in seen if seen.count(v) > 1), None)
            if dup is not None:
                raise ValueError(f"serve.api_keys: two keys have the {what} {dup!r}")
        return self


class CacheSettings(BaseModel):
    """The answer cache in front of generation: exact (same normalised question, filters, tenant
    and settings) and semantic (a question whose embedding is this close); an answer is dropped
    when a reindex changes a passage it was built from, and checked again when its sources gain
    documents (see rag/cache.py)."""

    backend: Literal["memory", "redis", "off"] = Field(
        default="memory", description="memory (this process), redis (shared by workers and instances), off.")
    ttl_s: int = Field(default=86_400, ge=1, le=7 * 86_400, description=(
        "Seconds a cached answer is served at most (a reindex that changes its sources drops it sooner)."))
    semantic: bool = Field(default=True, description="Also serve answers of near-identical questions.")
    semantic_threshold: float | None = Field(default=None, gt=0, le=1, description=(
        "Least cosine for a semantic hit; unset: the embedder's measured value (MiniLM 0.91, USE 0.85, "
        "others 0.95; see evals/RESULTS-cache.md and `ragqa eval cache`)."))
    guards: list[Literal["numbers", "entities", "negation", "qtype", "language"]] = Field(
        default=["numbers", "entities", "negation", "qtype", "language"], description=(
            "What a semantic hit's two questions must share besides a close embedding: the same numbers, "
            "names, negation, question type (who, when, how many...) and language."))
    max_entries: int = Field(default=10_000, ge=1, description="memory: answers kept (least recently used go).")
    semantic_scan: int = Field(
        default=256, ge=1, le=10_000, description="redis: the most recent answers per scope a semantic lookup compares.")
    redis_url: str | None = Field(default=None, description="redis: redis://host:6379/0; default serve.redis_url.")
    prefix: str = Field(default="ragqa:cache", description="redis: key prefix.")


class InjectionSettings(BaseModel):
    """The prompt-injection filter (rag/injection.py): screens questions and retrieved passages."""

    enabled: bool = True
    chunk_action: Literal["exclude", "quote"] = Field(
        default="exclude", description="A suspicious passage is left out of the context (exclude), or kept, "
        "wrapped and marked as quoted data (quote).")
    extra_patterns: dict[str, str] = Field(
        default_factory=dict, description="More rules, name -> regex (case-insensitive, on normalised text): "
        "a match blocks a question and flags a passage.")
    disabled_rules: tuple[str, ...] = Field(default=(), description="Built-in rules to turn off (false positives).")


class ExperimentArmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Recorded on every answer it makes.")
    profile: str = Field(default="default", min_length=1, description="The generator profile it answers with.")
    weight: float = Field(default=1.0, ge=0, description="Its relative share of the traffic.")


class ExperimentSettings(BaseModel):
    """An online A/B split between generator profiles (rag/experiments.py, docs/experiments.md).
    These settings only start it: ``ragqa experiment set|stop`` and ``/v1/admin/experiment``
    change it live, for every worker and instance, and what they set wins over these."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                             description="The experiment running from the start; none by default.")
    arms: list[ExperimentArmSettings] = Field(default_factory=list, description="The first arm is the control.")
    assign_by: Literal["key", "conversation"] = Field(default="key", description=(
        "What keeps a caller in its arm: the API key id (with auth off: the conversation), or the conversation."))
    refresh_s: float = Field(default=1.0, gt=0, le=60, description=(
        "Without Redis: a worker reads <data_dir>/experiment.json again at least this often (at once when "
        "it is replaced). With serve.redis_url it is read on every request."))
    records_ttl_s: int = Field(default=7 * 86_400, ge=60, description=(
        "How long each answer's record (versions, arm, timings) is kept for feedback and `ragqa experiment report`."))
    redis_prefix: str = Field(default="ragqa:ab", min_length=1, description="Redis key prefix (with serve.redis_url).")

    @model_validator(mode="after")
    def _arms(self) -> ExperimentSettings:
        if self.name and not self.arms:
            raise ValueError("experiment.name is set but experiment.arms is empty (the first arm is the control)")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"experiment.arms: an arm name is used twice: {names}")
        if self.arms and sum(a.weight for a in self.arms) <= 0:
            raise ValueError("experiment.arms: the weights add up to 0")
        return self


class RouterRules(BaseModel):
    """The router's thresholds (rag/routing.py): a question goes to the small profile only when
    every rule holds; the first one that fails sends it to the large profile, named in the reason.
    The defaults were fitted by ``ragqa eval fit-router`` on 300 XQuAD-en, XQuAD-zh and RGB-zh
    questions (the packaged 0.5B model against the 1.5B, a 1-point F1 budget): held out, about a
    quarter of the questions go to small for 2.4 F1 points (evals/RESULTS-profiles.md). The
    score thresholds are in ``rrf`` units. Refit on your own questions with
    ``ragqa eval fit-router SMALL_RUN LARGE_RUN``."""

    small_kinds: tuple[Literal["factual", "creative", "open"], ...] = Field(
        default=("factual", "open"),
        description="Question kinds (rag/sampling.py) the small profile may answer.")
    max_question_tokens: int = Field(
        default=14, ge=0, description="Longest question for the small profile (words; a Chinese character is one).")
    min_top_score: float = Field(
        default=1 / 61, ge=0, description="Least score of the top hit, in the retriever's units; 1/61 in rrf: "
        "first in both legs.")
    min_margin: float = Field(
        default=0.0, ge=0, description="Least lead of the top hit's score over the next one's.")
    min_agreement: float = Field(
        default=0.4, ge=0, le=1, description="Least overlap of the BM25 and vector legs' top 5 (0..1).")
    max_chunks: int = Field(default=1, ge=0, description="Most packed passages the small profile may read (not fitted).")
    max_turn: int = Field(default=1, ge=1, description="Latest conversation turn for the small profile (not fitted).")


class RoutingSettings(BaseModel):
    """Which generator profile answers a question (docs/profiles.md): ``off`` (always ``large``,
    ``default`` unless set), ``rules`` (the router in rag/routing.py picks ``small`` or ``large``
    from the question and its retrieval) or ``cascade`` (``small`` first, ``large`` when the small
    answer abstains, cites nothing or, with ``min_confidence``, is not confident enough)."""

    mode: Literal["off", "rules", "cascade"] = Field(default="off", description=(
        "off (one profile: large), rules (the router chooses small or large per question, before "
        "generation), cascade (small first; an answer that abstains or cites nothing is answered again by large)."))
    small: str = Field(default="small", description="The small profile's name (a key of profiles, or default).")
    large: str = Field(default="default", description="The large profile's name (a key of profiles, or default).")
    rules: RouterRules = Field(default_factory=RouterRules)
    min_confidence: float | None = Field(default=None, le=0.0, description=(
        "cascade only: a small answer whose confidence (the mean log-probability of its tokens, "
        "<= 0) is below this is answered again by large; null (the default): not checked. Fit it with "
        "ragqa eval fit-router on your own questions: on 72 XQuAD questions, 0.5B against 1.5B, the "
        "confidence ranked good-enough answers at chance (evals/RESULTS-profiles.md)."))
