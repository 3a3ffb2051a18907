"""The ``search`` tool: BM25 retrieval over a local corpus, in the shape of Search-R1's call.

Build an index once from a jsonl corpus (one ``{"title": ..., "text": ...}``
object per line; ``title`` optional), then hand :func:`search_tool` the
index directory::

    uv run python -m rlinf.reasoning.tools.search --corpus corpus.jsonl --out index/

The model calls ``{"name": "search", "arguments": {"query": "..."}}`` and
reads the ``top_k`` best passages as ``Doc 1 (Title: ...) text`` lines.
Retrieval is ``bm25s`` (English stopwords removed); each call loads the
saved index in its own process (see :mod:`rlinf.reasoning.tools.registry`).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bm25s

from rlinf.reasoning.tools.registry import Tool

__all__ = ["build_search_index", "main", "search_tool"]

_QUIET = {"show_progress": False}


def build_search_index(corpus: Sequence[dict[str, Any]], out_dir: str | Path) -> Path:
    """Indexes ``corpus`` (dicts with ``text`` and an optional ``title``) into ``out_dir``.

    Raises:
        ValueError: An empty corpus, or a record without a ``text`` string (named by index).
    """
    if not corpus:
        raise ValueError("the search corpus is empty; give at least one {'text': ...} record")
    for i, doc in enumerate(corpus):
        if not isinstance(doc.get("text"), str):
            raise ValueError(f"corpus record {i} has no 'text' string: {doc!r:.80}")
    texts = [f"{doc.get('title', '')} {doc['text']}".strip() for doc in corpus]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", **_QUIET), **_QUIET)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = [{"title": str(doc.get("title", "")), "text": doc["text"]} for doc in corpus]
    retriever.save(out, corpus=records)
    return out


def _search(query: str, index_dir: str, top_k: int) -> str:
    retriever = bm25s.BM25.load(index_dir, load_corpus=True)
    tokens = bm25s.tokenize([query], stopwords="en", **_QUIET)
    if not tokens.vocab:
        return "No results: the query has no searchable words."
    k = min(top_k, len(retriever.corpus))
    docs, scores = retriever.retrieve(tokens, k=k, **_QUIET)
    lines = [
        f"Doc {rank} (Title: {doc['title']}) {doc['text']}"
        if doc["title"]
        else f"Doc {rank} {doc['text']}"
        for rank, (doc, score) in enumerate(zip(docs[0], scores[0], strict=True), start=1)
        if score > 0
    ]
    return "\n".join(lines) or "No results."


def search_tool(index_dir: str | Path, top_k: int = 3, timeout_s: float = 10.0) -> Tool:
    """The ``search`` tool over the index :func:`build_search_index` wrote.

    Raises:
        FileNotFoundError: ``index_dir`` holds no index (names the build command).
    """
    index = Path(index_dir)
    if not (index / "params.index.json").is_file():
        raise FileNotFoundError(
            f"no search index in {index}; build one with: uv run python -m "
            f"rlinf.reasoning.tools.search --corpus CORPUS.jsonl --out {index}"
        )
    return Tool(
        "search",
        "Searches a document collection and returns the most relevant passages.",
        {
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 1}},
            "required": ["query"],
            "additionalProperties": False,
        },
        functools.partial(_search, index_dir=str(index), top_k=top_k),
        timeout_s,
        in_thread=True,  # a quick BM25 lookup
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Builds a search index from a jsonl corpus; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m rlinf.reasoning.tools.search",
        description="Build the BM25 index the search tool reads, from a jsonl corpus "
        '(one {"title": ..., "text": ...} object per line; title optional).',
    )
    parser.add_argument("--corpus", type=Path, required=True, help="the corpus, .jsonl")
    parser.add_argument("--out", type=Path, required=True, help="index directory to write")
    args = parser.parse_args(argv)
    with args.corpus.open(encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    out = build_search_index(corpus, args.out)
    print(f"indexed {len(corpus)} documents into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
