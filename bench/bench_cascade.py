"""What the cascade costs: the same questions answered by the small profile alone, the large one
alone, and the cascade (small first, large when the small answer abstains or cites nothing).

Each configuration is one ``ragqa eval answers`` run on the same seeded sample (resumable, the
answer cache off); this script runs them one after the other, then prints per configuration the
answer F1, the share of abstention questions (gold passages filtered out) answered "I don't
know", the latency p50/p95 of the whole answer and of the first token, and for the cascade the
share escalated and what the small try cost before an escalation. By default the small profile is
the extractive answerer and the large one the packaged Qwen2.5-Coder-1.5B on llama.cpp;
``small-q05`` and ``cascade-q05`` put the packaged Qwen2.5-Coder-0.5B in the small profile's place,
with ``--min-confidence`` as the cascade's ``routing.min_confidence``::

    source ~/.cache/ragqa/venv/bin/activate
    python bench/bench_cascade.py --out /tmp/ragqa-cascade -n 20 --abstain 5
    python bench/bench_cascade.py --configs small-q05,large,cascade-q05 --min-confidence -0.15

Results: docs/profiles.md ("What the cascade costs").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CONFIGS = {
    "small": {"RAG_GENERATOR__BACKEND": "extractive"},
    "large": {"RAG_GENERATOR__BACKEND": "llamacpp"},
    "cascade": {"RAG_GENERATOR__BACKEND": "llamacpp", "RAG_PROFILES__SMALL__BACKEND": "extractive",
                "RAG_ROUTING__MODE": "cascade"},
    "small-q05": {"RAG_GENERATOR__BACKEND": "llamacpp", "RAG_GENERATOR__MODEL": "qwen2.5-coder-0.5b-instruct"},
    "cascade-q05": {"RAG_GENERATOR__BACKEND": "llamacpp", "RAG_PROFILES__SMALL__BACKEND": "llamacpp",
                    "RAG_PROFILES__SMALL__MODEL": "qwen2.5-coder-0.5b-instruct", "RAG_ROUTING__MODE": "cascade"},
}


def run(name: str, env: dict[str, str], args: argparse.Namespace) -> Path:
    out = args.out / name
    cmd = [sys.executable, "-m", "ragqa.cli", "--data-dir", str(args.out / "data"), "eval", "answers",
           str(args.dataset), "-n", str(args.n), "--seed", str(args.seed), "--abstain", str(args.abstain),
           "--out", str(out), "--no-tracking", "--json"]
    full = {**os.environ, "RAG_CACHE__BACKEND": "off", **env}
    print(f"== {name}: {' '.join(f'{k}={v}' for k, v in env.items())}", file=sys.stderr, flush=True)
    subprocess.run(cmd, env=full, check=True, stdout=subprocess.DEVNULL, cwd=HERE)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def summary(name: str, folder: Path) -> dict[str, object]:
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines() if line.strip()]
    answers = [r for r in rows if r["pass"] == "answer"]
    abstain = [r for r in rows if r["pass"] == "abstain"]
    total = [r["timings"]["total_ms"] for r in rows if r["timings"].get("total_ms") is not None]
    ttft = [r["timings"]["ttft_ms"] for r in rows if r["timings"].get("ttft_ms") is not None]
    escalated = [r for r in rows if "cascade_small_ms" in r["timings"]]
    return {
        "config": name, "questions": len(answers), "abstain_questions": len(abstain),
        "f1": round(statistics.fmean(r["metrics"]["f1"] for r in answers), 3) if answers else None,
        "abstention": round(statistics.fmean(r["metrics"]["abstention"] for r in abstain), 3) if abstain else None,
        "total_p50_ms": round(pct(total, 0.5)), "total_p95_ms": round(pct(total, 0.95)),
        "ttft_p50_ms": round(pct(ttft, 0.5)), "ttft_p95_ms": round(pct(ttft, 0.95)),
        "escalated": f"{len(escalated)}/{len(rows)}" if name.startswith("cascade") else "",
        "small_try_ms_p50": round(pct([r["timings"]["cascade_small_ms"] for r in escalated], 0.5))
        if escalated else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ragqa-cascade"))
    parser.add_argument("--dataset", type=Path, default=HERE / "tests" / "data" / "xquad-en")
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("--abstain", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", default="small,large,cascade", help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--min-confidence", type=float, default=None,
                        help="routing.min_confidence for the cascade configurations (unset: not checked)")
    args = parser.parse_args()
    names = args.configs.split(",")
    extra = {} if args.min_confidence is None else {"RAG_ROUTING__MIN_CONFIDENCE": str(args.min_confidence)}
    folders = {name: run(name, {**CONFIGS[name], **(extra if name.startswith("cascade") else {})}, args)
               for name in names}
    table = [summary(name, folder) for name, folder in folders.items()]
    keys = list(table[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in table:
        print("| " + " | ".join("" if row[k] is None else str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
