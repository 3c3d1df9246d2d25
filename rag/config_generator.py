"""The answer-writing sections of the settings: the generator, the packed context's limits,
sampling, prompts and inferred citations."""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, Field, SecretStr


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
