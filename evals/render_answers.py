"""Render answer-evaluation runs (``ragqa eval answers`` folders) as one Markdown table.

A run stopped early is rendered from the questions it finished (its ``n`` says how many).

    python evals/render_answers.py /tmp/ragqa-answers/*/      # one row per run folder
"""

from __future__ import annotations

import sys
from pathlib import Path

from evals.answers import summarize
from evals.compare import load_run

COLUMNS = (("EM", "em"), ("F1", "f1"), ("contains gold", "contains_gold"), ("BLEU-4", "bleu4"),
           ("ROUGE-L", "rouge_l"), ("compliance", "compliance"), ("explicit", "explicit_compliance"),
           ("citation acc.", "citation_accuracy"),
           ("support", "support"), ("abstention", "abstention"))
LATENCY = (("TTFT p50 / p99 s", "ttft_ms"), ("total p50 / p99 s", "total_ms"))


def row(folder: Path) -> str:
    s = summarize(load_run(folder))
    m = s["metrics"]
    cells = [folder.name, str(s["questions"])]
    cells += [f"{m[k]:.3f}" if k in m else "–" for _, k in COLUMNS]
    cells[-1] += f" ({s['abstention_questions']})" if "abstention" in m else ""
    for _, key in LATENCY:
        lat = s["latency"].get(key)
        cells.append(f"{lat['p50'] / 1000:.2f} / {lat['p99'] / 1000:.2f}" if lat else "–")
    tps = s["latency"].get("tokens_per_s")
    cells.append(f"{tps['p50']:.1f}" if tps else "–")
    prompt = s["latency"].get("prompt_tokens")
    cells.append(f"{prompt['p50']:.0f}" if prompt else "–")
    return "| " + " | ".join(cells) + " |"


def main(folders: list[str]) -> None:
    head = ["run", "n", *(label for label, _ in COLUMNS), *(label for label, _ in LATENCY), "tok/s p50",
            "prompt tokens p50"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for folder in folders:
        print(row(Path(folder)))


if __name__ == "__main__":
    main(sys.argv[1:])
