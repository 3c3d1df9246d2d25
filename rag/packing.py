"""Context packing: ranked chunks into a token budget, each with a citation label.

The budget is measured with the generator's own tokenizer (any ``TokenCounter``, or a
plain ``str -> int`` function) on the exact text the prompt will hold, so it is never
exceeded. Chunks go in rank order; the first one that does not fit is cut at a word
boundary to fill the remaining room (when enough room is left), and packing stops there:
a better chunk is never left out while a worse one gets in.

Example::

    packer = ContextPacker(generator.count_tokens, max_tokens=3000)
    packed = packer.pack(hits)
    prompt_context = packed.text          # "[1] Title (url, 2025-01-02)\\n...\\n\\n[2] ..."
    packed.citations[1].url               # what label [1] points to
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag.errors import ConfigError
from rag.types import Chunk, Citation, Hit, Passage, TokenCounter

__all__ = ["ContextPacker", "PackedContext", "context_budget", "passage_header"]

SEPARATOR = "\n\n"
SNIPPET_CHARS = 240


@dataclass(frozen=True, slots=True)
class PackedContext:
    """The packed context, its passages and what each label cites.

    ``tokens`` is the token count of ``text``; ``dropped`` lists chunk ids left out for
    lack of room, ``truncated`` the chunk that was cut to fit (if any).
    """

    text: str
    passages: tuple[Passage, ...]
    citations: dict[int, Citation]
    tokens: int
    budget: int
    dropped: tuple[str, ...] = ()
    truncated: str | None = None


def context_budget(context_window: int, max_context_tokens: int, reserved_tokens: int) -> int:
    """Tokens left for context: at most ``max_context_tokens``, leaving ``reserved_tokens``
    of the model's window for the instructions, the question and the answer."""
    room = context_window - reserved_tokens
    if room <= 0:
        raise ConfigError(
            f"the model's context window ({context_window} tokens) leaves no room for context after "
            f"{reserved_tokens} tokens of prompt and answer; lower max_tokens or use a longer context")
    return min(max_context_tokens, room)


def passage_header(label: int, chunk: Chunk) -> str:
    """``[label] Title (url, modified date)``: what the model sees before each passage."""
    title = chunk.title or chunk.doc_id
    if chunk.heading and chunk.heading != title:
        title = f"{title} › {chunk.heading}"
    where = [chunk.url] if chunk.url else []
    if chunk.modified is not None:
        where.append(chunk.modified.date().isoformat())
    return f"[{label}] {title}" + (f" ({', '.join(where)})" if where else "")


class ContextPacker:
    """Packs ranked hits into at most ``max_tokens`` tokens, labelled ``[1]``, ``[2]``, ...

    ``min_passage_tokens`` is the least room worth filling with a truncated passage;
    ``max_chunks``, when set, is the most passages packed.

    Example::

        packed = ContextPacker(tokenizer_count, max_tokens=512).pack(hits)
        assert packed.tokens <= 512
    """

    def __init__(self, counter: TokenCounter | Callable[[str], int], max_tokens: int,
                 min_passage_tokens: int = 32, max_chunks: int | None = None) -> None:
        if max_tokens < 1:
            raise ConfigError(f"the context budget must be at least 1 token, got {max_tokens}")
        self.count: Callable[[str], int] = (
            counter.count_tokens if isinstance(counter, TokenCounter) else counter)
        self.max_tokens = max_tokens
        self.min_passage_tokens = min_passage_tokens
        self.max_chunks = max_chunks

    def pack(self, hits: Sequence[Hit]) -> PackedContext:
        ranked = [(h, h.chunk) for h in hits if h.chunk is not None]
        if self.max_chunks is not None:
            ranked = ranked[: self.max_chunks]
        blocks: list[str] = []
        sizes: list[int] = []
        truncated: str | None = None
        used = 0
        for _, chunk in ranked:
            label = len(blocks) + 1
            block = f"{passage_header(label, chunk)}\n{chunk.text}"
            # Counted block by block (separators are whitespace, where tokenizers split);
            # the total is checked on the whole text below.
            size = self.count((SEPARATOR if blocks else "") + block)
            if used + size > self.max_tokens:
                cut = self._truncate(label, chunk, self.max_tokens - used - (self.count(SEPARATOR) if blocks else 0))
                if cut is not None:
                    blocks.append(cut[0])
                    sizes.append(cut[1])
                    truncated = chunk.id
                break
            blocks.append(block)
            sizes.append(size)
            used += size
        text = SEPARATOR.join(blocks)
        tokens = self.count(text)
        while tokens > self.max_tokens and blocks:  # a tokenizer merged across a boundary
            blocks.pop()
            sizes.pop()
            truncated = None
            text = SEPARATOR.join(blocks)
            tokens = self.count(text)
        passages = tuple(Passage(i + 1, chunk, size, h.score)
                         for i, ((h, chunk), size) in enumerate(zip(ranked, sizes, strict=False)))
        citations = {p.label: _citation(p.label, p.chunk) for p in passages}
        dropped = tuple(h.chunk_id for h, _ in ranked[len(passages):])
        return PackedContext(text, passages, citations, tokens, self.max_tokens, dropped,
                             truncated if passages and truncated == passages[-1].chunk.id else None)

    def _truncate(self, label: int, chunk: Chunk, room: int) -> tuple[str, int] | None:
        """The longest word-boundary prefix of ``chunk`` whose block fits ``room`` tokens."""
        head = f"{passage_header(label, chunk)}\n"
        if room - self.count(head) < self.min_passage_tokens:
            return None
        text = chunk.text
        full = self.count(head + text)
        # Start from the proportional guess, then binary search a narrow bracket around it.
        guess = int(len(text) * room / max(full, 1))
        lo, hi = max(1, int(guess * 0.85)), min(len(text) - 1, int(guess * 1.15) + 8)
        best = self._fit(head, text, lo, lo, room)
        if best is None:  # the guess was far off: search everything below it
            lo, hi = 1, lo - 1
        return self._fit(head, text, lo, hi, room) or best

    def _fit(self, head: str, text: str, lo: int, hi: int, room: int) -> tuple[str, int] | None:
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            block = head + _word_prefix(text, mid) + " …"
            tokens = self.count(block)
            if tokens <= room:
                best, lo = (block, tokens), mid + 1
            else:
                hi = mid - 1
        return best


def _word_prefix(text: str, n: int) -> str:
    """``text[:n]`` backed off to the last space when there is one nearby (not in CJK text)."""
    prefix = text[:n]
    space = prefix.rfind(" ")
    if space > n * 0.8:
        prefix = prefix[:space]
    return prefix.rstrip()


def _citation(label: int, chunk: Chunk) -> Citation:
    snippet = " ".join(chunk.text.split())
    if len(snippet) > SNIPPET_CHARS:
        snippet = snippet[: SNIPPET_CHARS - 1].rstrip() + "…"
    return Citation(label=label, chunk_id=chunk.id, doc_id=chunk.doc_id, title=chunk.title or chunk.doc_id,
                    url=chunk.url, modified=chunk.modified, snippet=snippet, source=chunk.source)
