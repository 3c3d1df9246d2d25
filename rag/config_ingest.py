"""The ingestion sections of the settings: the sources documents come from, how they are
chunked, crawled and scheduled, and where the ingestion state is kept."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from rag.types import Trust

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
