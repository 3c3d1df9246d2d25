"""A tiny Llama model folder for vLLM tests and benchmarks: no download, built in ~1 s.

It holds a ``config.json`` (2 layers, hidden 128, head_dim 64), a byte-level BPE tokenizer
trained here by the ``tokenizers`` library on a built-in corpus (``tokenizer.json`` and a
``tokenizer_config.json`` with a small chat template), and no weights: load it with
``load_format="dummy"`` (random weights), ``dtype="float32"`` and ``enforce_eager=True``.
The output is gibberish, but the engine does all of its real work: scheduling, batching,
KV cache, sampling, detokenization, stop strings. The same inputs give the same folder.

Example::

    from tests.vllm_tiny import build_tiny_model
    model_dir = build_tiny_model(tmp_path / "tiny")
    VllmGenerator(model=str(model_dir), load_format="dummy", dtype="float32", ...)
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "TINY_MAX_LEN", "build_tiny_model"]

TINY_MAX_LEN = 512
SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the a an of to in is was for on with as by at from that this it be are or and "
    "question answer context source passage document search index vector model token "
    "python release version function module class method error value list string number "
    "paris france capital city river library server client request response stream batch "
    "问题 答案 文档 检索 模型 中国 北京 上海 数据 向量"
).split()


def _corpus() -> list[str]:
    """A few thousand deterministic pseudo-sentences (a linear congruential generator)."""
    state, lines = 12345, []
    for _ in range(3000):
        words = []
        for _ in range(12):
            state = (1103515245 * state + 12345) % 2**31
            words.append(_WORDS[state % len(_WORDS)])
        lines.append(" ".join(words).capitalize() + ".")
    return lines


def build_tiny_model(path: str | Path, *, vocab_size: int = 1024, layers: int = 2) -> Path:
    """Write the tiny model folder at ``path`` (created; reused when already complete)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    done = out / ".complete"
    if done.exists():
        return out
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "model_max_length": TINY_MAX_LEN,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1), encoding="utf-8")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": TINY_MAX_LEN,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "tie_word_embeddings": False,
        "dtype": "float32",
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"],
    }), encoding="utf-8")
    done.touch()
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ragqa-tiny-llama"))
