"""Generators: the language models that write answers (the ``rag.types.Generator`` Protocol).

- ``llamacpp``: llama-cpp-python with a GGUF model on CPU, the embedded default
  (``pip install 'ragqa[llamacpp]'``).
- ``vllm``: vLLM's async engine in this process, for a single GPU box (``ragqa[vllm]``).
- ``openai``: any OpenAI-compatible chat/completions server, such as ``vllm serve``.
- ``extractive``: no model; the best supporting sentences of the context, with citations.
  It is also the fallback when the configured generator is down.

For tests of code that uses a generator, :class:`rag.generators.scripted.ScriptedGenerator`
replays given text (no model, not a settings backend).

Example::

    from rag.generators import make_generator
    generator = make_generator(settings.generator)
    await generator.start()
    async for delta in generator.stream(prompt, GenerationParams()):
        print(delta.text, end="")
"""

from __future__ import annotations

from rag.config import GeneratorSettings
from rag.errors import ConfigError
from rag.types import Generator

__all__ = ["make_generator"]


def make_generator(settings: GeneratorSettings) -> Generator:
    """Build the generator ``settings`` names. Loads nothing until ``start()``."""
    backend = settings.backend
    if backend == "extractive":
        from rag.generators.extractive import ExtractiveGenerator

        return ExtractiveGenerator()
    if backend == "llamacpp":
        from rag.generators.llamacpp import LlamaCppGenerator

        return LlamaCppGenerator.from_settings(settings)
    if backend == "vllm":
        from rag.generators.vllm_engine import VllmGenerator

        return VllmGenerator.from_settings(settings)
    if backend == "openai":
        from rag.generators.openai_server import OpenAIGenerator

        return OpenAIGenerator.from_settings(settings)
    raise ConfigError(f"unknown generator backend {backend!r}")
