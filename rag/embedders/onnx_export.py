"""Build a sentence-transformers BERT model's int8 ONNX file once per machine, and find it again.

:func:`int8_model` exports the transformer of a local model folder (the packaged
all-MiniLM-L6-v2 by default) to ONNX with ``torch.onnx`` (dynamic batch and sequence axes),
quantizes its weights to int8 with onnxruntime's dynamic quantization, and keeps the result in
``~/.cache/ragqa/models/<name>-onnx-int8/`` (``$RAGQA_MODEL_DIR`` moves it) beside a
``checksum.json``: the SHA-256 of the source weights and the export recipe. The model is
rebuilt when either is missing or differs. It is built in a temporary folder and renamed into
place under a file lock, so a reader never sees half a model and two processes starting at once
build it once.

The recipe: weights quantized per output channel (``per_channel``) for every op type
onnxruntime quantizes. Per-tensor weights (the default) lose too much on MiniLM: the minimum
cosine to fp32 over 240 XQuAD passages was 0.896 per tensor against 0.986 per channel
(``bench/RESULTS-onnx.md``).

Example::

    from rag.embedders.onnx_export import int8_model
    path = int8_model(folder, "all-MiniLM-L6-v2")   # ~/.cache/ragqa/models/all-MiniLM-L6-v2-onnx-int8/model.onnx
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rag.errors import EmbedderError

__all__ = ["RECIPE", "export_fp32", "int8_model", "quantize_int8", "source_weights"]

#: What a cached model was built with; a change here rebuilds every cached model.
RECIPE: dict[str, Any] = {
    "version": 1,
    "opset": 17,
    "attention": "eager",
    "quantization": "dynamic",
    "weight_type": "QInt8",
    "per_channel": True,
    "op_types": "all",
}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_BLOCK = 1 << 20


def source_weights(folder: Path) -> Path:
    """The weights file of a model folder; ``EmbedderError`` when there is none."""
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise EmbedderError(f"cannot build an ONNX model from {str(folder)!r}: no {' or '.join(_WEIGHT_FILES)} in it")


def int8_model(folder: Path, name: str, cache_dir: Path | None = None) -> Path:
    """The int8 ONNX file of the model in ``folder``, built on first use into ``<name>-onnx-int8/``.

    Raises ``EmbedderError`` with one line when the folder has no weights or the build fails.
    """
    from rag.generators.gguf_models import model_cache_dir

    root = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    target = root / f"{name}-onnx-int8"
    weights = source_weights(folder)
    if _current(target, weights, quick=True):
        return target / "model.onnx"
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(target) + ".lock"):
        if not _current(target, weights, quick=False):  # another process may have built it meanwhile
            _build(folder, weights, target)
    return target / "model.onnx"


def _current(target: Path, weights: Path, quick: bool) -> bool:
    """Whether ``target`` holds a model built from ``weights`` with this recipe.

    ``quick`` trusts a recorded size and modification time of the weights instead of hashing
    them (0.2 s for MiniLM's 91 MB); otherwise the SHA-256 decides.
    """
    try:
        recorded = json.loads((target / "checksum.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not (target / "model.onnx").is_file() or recorded.get("recipe") != RECIPE:
        return False
    stat = weights.stat()
    if quick:
        return recorded.get("source_size") == stat.st_size and recorded.get("source_mtime_ns") == stat.st_mtime_ns
    return recorded.get("source_sha256") == _sha256(weights)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _build(folder: Path, weights: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like the other models
    old = target.with_name(f".{target.name}.{os.getpid()}.old")
    try:
        fp32 = tmp / "fp32.onnx"
        export_fp32(folder, fp32)
        quantize_int8(fp32, tmp / "model.onnx")
        fp32.unlink()
        stat = weights.stat()
        record = {"source": str(weights), "source_sha256": _sha256(weights), "source_size": stat.st_size,
                  "source_mtime_ns": stat.st_mtime_ns, "recipe": RECIPE}
        (tmp / "checksum.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def export_fp32(folder: Path, out: Path) -> None:
    """Export the transformer of ``folder`` (its last hidden state) to an fp32 ONNX file."""
    import warnings

    try:
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise EmbedderError(f"exporting to ONNX needs torch and transformers: {exc}") from exc

    class _Hidden(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    try:
        # Eager attention traces to plain ops; SDPA's tracing bakes in shape-dependent branches.
        from rag.embedders.st import _no_load_progress_bar

        with _no_load_progress_bar():
            model = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
        ids = torch.ones((2, 16), dtype=torch.long)
        axes = {n: {0: "batch", 1: "sequence"} for n in (*INPUTS, "last_hidden_state")}
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's warnings about Python-side shape checks
            torch.onnx.export(_Hidden(model), (ids, ids, torch.zeros_like(ids)), str(out), dynamo=False,
                              input_names=list(INPUTS), output_names=["last_hidden_state"],
                              dynamic_axes=axes, opset_version=RECIPE["opset"], do_constant_folding=True)
    except Exception as exc:  # transformers and the exporter raise many kinds
        raise EmbedderError(f"cannot export {str(folder)!r} to ONNX: {exc}") from exc


def quantize_int8(fp32: Path, out: Path) -> None:
    """Quantize an fp32 ONNX file's weights to int8 (dynamic activations, per-channel weights)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It logs advice through the root logger, which would also install a handler on it
    # (logging.basicConfig) in a process that has none.
    root, handler = logging.getLogger(), logging.NullHandler()
    level = root.level
    root.addHandler(handler)
    root.setLevel(max(level, logging.ERROR))
    try:
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=RECIPE["per_channel"])
    except Exception as exc:  # onnx and onnxruntime raise many kinds
        raise EmbedderError(f"cannot quantize {fp32.name} to int8: {exc}") from exc
    finally:
        root.setLevel(level)
        root.removeHandler(handler)
