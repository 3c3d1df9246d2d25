"""Experiment tracking of evaluation runs in MLflow (the optional ``tracking`` extra).

Each answer evaluation becomes one MLflow run in the ``eval.experiment`` experiment: the
configuration (flattened, as params, and whole as ``config.json``), the generator, model and
quantization and the index snapshot (as tags), every mean metric and every latency
percentile (as metrics), and the per-question table and the summary (as artifacts).

The store is ``eval.tracking_uri``; by default a SQLite database in the data dir
(``<data_dir>/mlflow.db``) with artifacts beside it in ``<data_dir>/mlruns``, so
``mlflow ui --backend-store-uri sqlite:///<data_dir>/mlflow.db`` shows them. Without MLflow
installed (``pip install 'ragqa[tracking]'``) the harness works the same and says once that
tracking is off.

Example::

    run_id = log_run(Path("runs/xquad"), summary, settings)   # None when MLflow is missing
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rag.config import Settings

__all__ = ["log_run", "tracking_uri"]

log = logging.getLogger(__name__)
_said_off = False
PARAM_CHARS = 500  # longer values are cut: a param is a label, the whole config is an artifact


def tracking_uri(settings: Settings) -> str:
    """Where runs are logged: ``eval.tracking_uri``, or SQLite in the data dir."""
    return settings.eval.tracking_uri or f"sqlite:///{Path(settings.data_dir).resolve() / 'mlflow.db'}"


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def log_run(run_dir: Path, summary: Mapping[str, Any], settings: Settings) -> str | None:
    """Log one evaluation run; returns its MLflow run id, or ``None`` when tracking is off."""
    global _said_off
    if not settings.eval.tracking:
        return None
    try:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient
    except ImportError:
        if not _said_off:
            log.warning("MLflow is not installed, so experiment tracking is off (pip install 'ragqa[tracking]')")
            _said_off = True
        return None
    uri = tracking_uri(settings)
    client = MlflowClient(tracking_uri=uri)
    name = settings.eval.experiment
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        artifacts = (Path(settings.data_dir).resolve() / "mlruns").as_uri() if uri.startswith("sqlite:") else None
        experiment_id = client.create_experiment(name, artifact_location=artifacts)
    index = summary.get("index") or {}
    tags = {"dataset": summary.get("dataset"), "generator": summary.get("generator"), "model": summary.get("model"),
            "quantization": summary.get("quantization"), "index.documents": index.get("documents"),
            "index.chunks": index.get("chunks"), "index.generation": index.get("lexical_generation"),
            "index.embedder": index.get("embedder"),
            "run_dir": str(run_dir), "sample": summary.get("sample"), "seed": summary.get("seed")}
    run = client.create_run(experiment_id, run_name=run_dir.name,
                            tags={k: str(v) for k, v in tags.items() if v is not None})
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in summary.get("metrics", {}).items()]
    for stage, stats in summary.get("latency", {}).items():
        metrics += [Metric(f"{stage}.{s}", float(v), now, 0) for s, v in stats.items()]
    metrics += [Metric(k, float(summary.get(k) or 0), now, 0) for k in ("questions", "errors", "degraded")]
    params = [Param(k, str(v)[:PARAM_CHARS]) for k, v in _flatten(summary.get("config", {}))]
    try:
        for chunk in _batches(params, 100):
            client.log_batch(run_id, params=chunk)
        for chunk in _batches(metrics, 1000):
            client.log_batch(run_id, metrics=chunk)
        client.log_batch(run_id, tags=[RunTag("mlflow.note.content", f"ragqa eval answers: {summary.get('dataset')}")])
        client.log_dict(run_id, dict(summary.get("config", {})), "config.json")
        for file in ("rows.jsonl", "summary.json"):
            if (run_dir / file).is_file():
                client.log_artifact(run_id, str(run_dir / file))
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    log.info("logged to MLflow at %s, run %s", uri, run_id)
    return run_id
