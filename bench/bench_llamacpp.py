"""Benchmark the packaged llama.cpp models on short RAG questions (English and Chinese).

For each model: load time, median time to first token, decode tokens/s, and how many
answers contain the gold fact. Each question has three short passages, one with the gold
fact. Two prompt styles:

- ``product``: ``rag.prompts.build_prompt`` (system rules + XML sections; chat template
  when the model has one, else the plain-text ``completion``), what the service sends;
- ``short``: a terse completion prompt ending in ``Answer:`` / ``答案：`` (no chat template),
  the one the tests use to get the 270M base model to answer.

Run (results go to bench/RESULTS-llamacpp.md by hand)::

    python bench/bench_llamacpp.py --threads 2
    python bench/bench_llamacpp.py --models gemma-3-270m --styles short
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from rag.generators.gguf_models import PACKAGED_MODELS, packaged_model_path
from rag.generators.llamacpp import LlamaCppGenerator
from rag.types import GenerationParams, Prompt

# (question, gold, passages): passage 1 has the gold fact, the others are distractors.
QUESTIONS = [
    ("What port does the Orbis server listen on by default?", "7341",
     ["The Orbis server listens on port 7341 by default; set ORBIS_PORT to change it.",
      "Orbis writes its logs to /var/log/orbis and rotates them daily.",
      "The Orbis client retries a failed request three times."]),
    ("Who founded the Halvard Institute?", "Mira Castellan",
     ["The Halvard Institute was founded by Mira Castellan in 1987 in Rotterdam.",
      "The institute publishes an annual report on coastal erosion.",
      "Its library holds more than 40,000 volumes."]),
    ("How many days of annual leave do new employees get?", "23",
     ["New employees get 23 days of annual leave per year, rising to 28 after five years.",
      "Sick leave must be reported to the team lead before 10:00.",
      "Expense claims are paid at the end of each month."]),
    ("Which database does the billing service use?", "PostgreSQL",
     ["The billing service stores invoices in PostgreSQL 16, replicated to a standby.",
      "The search service uses an Elasticsearch cluster of three nodes.",
      "Session data is kept in Redis with a one-hour expiry."]),
    ("What is the maximum upload size?", "250 MB",
     ["Uploads are limited to 250 MB per file; larger files must be split.",
      "Supported formats are PDF, DOCX and plain text.",
      "Uploaded files are scanned for viruses before indexing."]),
    ("In which city is the company's headquarters?", "Tampere",
     ["The company's headquarters are in Tampere, Finland, next to the railway station.",
      "The company has sales offices in Berlin and Madrid.",
      "The data centre is located in a former paper mill."]),
    ("公司的年假有多少天？", "15",
     ["新员工每年享有15天带薪年假，工作满五年后增加到20天。",
      "病假需要在上午十点前报告给直属主管。",
      "报销款项在每月月底统一发放。"]),
    ("星河数据库默认使用哪个端口？", "6612",
     ["星河数据库默认监听6612端口，可以通过配置文件修改。",
      "星河数据库的日志保存在 /var/log/xinghe 目录中。",
      "客户端在请求失败时会重试三次。"]),
    ("青松研究所是谁创办的？", "林晓梅",
     ["青松研究所由林晓梅于1992年在杭州创办。",
      "研究所每年发布一份关于湿地保护的报告。",
      "研究所的图书馆藏书超过三万册。"]),
    ("计费服务使用什么数据库？", "PostgreSQL",
     ["计费服务把发票存放在 PostgreSQL 16 中，并复制到一台备用服务器。",
      "搜索服务使用由三个节点组成的 Elasticsearch 集群。",
      "会话数据保存在 Redis 中，一小时后过期。"]),
    ("上传文件的最大大小是多少？", "200",
     ["每个上传文件最大为200MB，更大的文件需要拆分后上传。",
      "支持的格式包括 PDF、DOCX 和纯文本。",
      "上传的文件在建立索引前会进行病毒扫描。"]),
    ("公司总部位于哪个城市？", "成都",
     ["公司总部位于成都高新区，靠近地铁站。",
      "公司在北京和上海设有销售办事处。",
      "数据中心位于一座旧工厂改建的园区内。"]),
]


def is_zh(question: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in question)


def context_text(passages: list[str]) -> str:
    return "\n\n".join(f"[{i}] {text}" for i, text in enumerate(passages, 1))


def short_prompt(question: str, passages: list[str]) -> Prompt:
    """A terse completion prompt a small base model can follow (no chat template)."""
    context = ("" if is_zh(question) else " ").join(passages)  # one line: "\n" is the stop string
    if is_zh(question):
        text = f"资料：{context}\n问题：{question}\n答案："
    else:
        text = f"Context: {context}\nQuestion: {question}\nAnswer:"
    return Prompt(messages=({"role": "user", "content": text},), completion=text, question=question,
                  lang="zh" if is_zh(question) else "en", stop=("\n",))


def product_prompt(question: str, passages: list[str]) -> Prompt:
    from rag.packing import PackedContext
    from rag.prompts import build_prompt

    text = context_text(passages)
    return build_prompt(question, PackedContext(text=text, passages=(), citations={}, tokens=0, budget=0))


async def run_model(name: str, style: str, threads: int, max_tokens: int, penalty: float) -> dict[str, object]:
    generator = LlamaCppGenerator(model=name, threads=threads, n_ctx=2048)
    t0 = time.perf_counter()
    await generator.start()
    load_s = time.perf_counter() - t0
    if style == "short":
        generator._formatter = None
    ttfts, rates, hits, answers = [], [], {"en": 0, "zh": 0}, []
    params = GenerationParams(temperature=0.0, max_tokens=max_tokens, repetition_penalty=penalty, seed=0)
    for question, gold, passages in QUESTIONS:
        prompt = (short_prompt if style == "short" else product_prompt)(question, passages)
        text, first, final = "", None, None
        start = time.perf_counter()
        async for delta in generator.stream(prompt, params):
            if delta.text and first is None:
                first = time.perf_counter() - start
            text += delta.text
            final = delta
        total = time.perf_counter() - start
        first = first if first is not None else total
        ttfts.append(first)
        if final and final.completion_tokens and final.completion_tokens > 1 and total > first:
            rates.append((final.completion_tokens - 1) / (total - first))
        ok = gold.lower() in text.lower()
        hits["zh" if is_zh(question) else "en"] += ok
        answers.append((ok, question, text.strip().replace("\n", " ")[:120]))
    await generator.close()
    return {"load_s": load_s, "ttft_s": statistics.median(ttfts),
            "tok_s": statistics.median(rates) if rates else 0.0, "hits": hits, "answers": answers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(PACKAGED_MODELS))
    parser.add_argument("--styles", nargs="+", default=["product", "short"], choices=["product", "short"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args()
    n_en = sum(not is_zh(q) for q, _, _ in QUESTIONS)
    n_zh = len(QUESTIONS) - n_en
    print(f"| model | prompt | load s | TTFT s (median) | decode tok/s | gold EN /{n_en} | gold ZH /{n_zh} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.models:
        t0 = time.perf_counter()
        packaged_model_path(name)  # assembled once into the cache; not part of the load time
        print(f"<!-- {name}: assembled/located in {time.perf_counter() - t0:.1f} s -->", flush=True)
        for style in args.styles:
            r = asyncio.run(run_model(name, style, args.threads, args.max_tokens, args.repetition_penalty))
            print(f"| {name} | {style} | {r['load_s']:.1f} | {r['ttft_s']:.2f} | {r['tok_s']:.1f} "
                  f"| {r['hits']['en']} | {r['hits']['zh']} |", flush=True)
            if args.show:
                for ok, question, answer in r["answers"]:
                    print(f"    {'OK ' if ok else '-- '} {question} -> {answer}")


if __name__ == "__main__":
    main()
