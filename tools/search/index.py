"""Build, save and open a BM25 index for a large passage collection (wiki-18 size).

The search tool indexes a small JSONL corpus in memory at start-up. A collection of
millions of passages is indexed once, ahead of time, into a directory that the server
then memory-maps, so a replica starts in seconds and its resident memory is only the
pages its queries touch:

    python -m tools.search.index build passages.jsonl /srv/index/wiki18   # progress bar
    python -m tools.search.index info /srv/index/wiki18

and in the server config ``args: {index: /srv/index/wiki18}`` on ``tools.search:SearchTool``.

Input lines are passages in any of the usual layouts: ``{"id", "title", "text"}`` (DPR,
FlashRAG), ``{"id", "title", "contents"}`` (ours), or ``{"id", "contents"}`` with
``contents = '"Title"\\ntext'`` (Search-R1's ``wiki-18.jsonl``).

Layout of the directory (``manifest.json`` describes it):

* ``bm25/``: bm25s's own saved layout (CSC score matrix, vocabulary, parameters), so
  ``bm25s.BM25.load(dir / "bm25", mmap=True)`` reads it too; scores are bm25s's "lucene"
  BM25, bit for bit (tests/tools/search/test_scale.py checks it against ``bm25s.BM25.index``).
* ``term_max.npy``: each term's highest posting score (float32), which bounds what a term
  can add to a passage's score (tools/search/topk.py).
* ``docs.bin`` + ``docs.offsets.npy``: the passages themselves, one JSON array
  ``[id, title, contents]`` each, read by offset from a memory map.

The build streams: passages are tokenised in chunks whose postings are spilled to disk,
then scattered into the final memory-mapped arrays, so the memory it needs grows with the
vocabulary and the chunk size, not with the collection.

Format 1 also kept every term's postings a second time, best score first, for a scorer
that has been replaced (tools/search/topk.py has today's); ``python -m tools.search.index
upgrade DIR`` turns such an index into the current format in place, without rebuilding it.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import shutil
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import orjson
from tqdm import tqdm

from tools.search.corpus import CorpusError, Document
from tools.search.tokens import Tokenizer
from tools.search.topk import term_maxima

__all__ = [
    "DocStore",
    "SearchIndexError",
    "Manifest",
    "build_index",
    "load_manifest",
    "main",
    "parse_passage",
    "upgrade_index",
]

FORMAT = "toolfactory-bm25-2"  # bump when the layout changes; upgrade_index() knows the older ones
MANIFEST = "manifest.json"
BM25_DIR = "bm25"
DOCS_BIN = "docs.bin"
DOCS_OFFSETS = "docs.offsets.npy"
TERM_MAX = "term_max.npy"
_FORMAT_1 = "toolfactory-bm25-1"
_FORMAT_1_ONLY = ("impact.docs.npy", "impact.scores.npy")  # its best-first copy of the postings


class SearchIndexError(ValueError):
    """A saved index directory is missing, incomplete or of another format; the message says which."""


@dataclass(frozen=True)
class Manifest:
    format: str
    num_docs: int
    num_terms: int
    num_postings: int
    tokenizer: str  # Tokenizer.name: queries must be tokenised the same way
    k1: float
    b: float
    title_weight: int
    source: str
    build_s: float


def parse_passage(record: Any, line: int) -> Document:
    """One passage in any of the layouts the module docstring lists."""
    if not isinstance(record, dict):
        raise CorpusError(f"line {line}: expected an object with id, title and text/contents")
    text = record.get("text", record.get("contents"))
    if not isinstance(text, str):
        raise CorpusError(f"line {line}: 'text' or 'contents' must be a string")
    title = record.get("title")
    if title is None and "text" not in record and text.startswith('"'):
        head, sep, rest = text.partition("\n")  # Search-R1: '"Title"\ntext'
        if sep and head.endswith('"') and len(head) >= 2:
            title, text = head[1:-1], rest
    if not isinstance(title, str | None):
        raise CorpusError(f"line {line}: 'title' must be a string")
    raw_id = record.get("id", line - 1)
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        raise CorpusError(f"line {line}: 'id' must be a string or an integer")
    return Document(str(raw_id), title or "", text)


def _passages(path: Path) -> Iterator[Document]:
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CorpusError(f"{path}, line {number}: not valid JSON ({exc})") from None
            yield parse_passage(record, number)


# ------------------------------------------------------------------------ build


def build_index(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    stemmer: str | None = "auto",
    k1: float = 1.5,
    b: float = 0.75,
    title_weight: int = 2,
    chunk_docs: int = 50_000,
    progress: bool = True,
) -> Manifest:
    """Index the JSONL passages in ``source`` into the directory ``out`` (replaced atomically)."""

    source, out = Path(source), Path(out)
    if not source.is_file():
        raise CorpusError(f"corpus file {source} does not exist")
    started = time.perf_counter()
    tokenizer = Tokenizer(stemmer)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        spill = _Spill(work / "spill")
        vocab: dict[str, int] = {}
        lengths = array("q")  # 8 bytes a passage: 21M Python ints would take ~0.8 GB
        total = source.stat().st_size
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenising", disable=not progress)
        with open(work / DOCS_BIN, "wb") as docs_out:
            offsets = array("q", [0])
            flat: list[int] = []
            chunk_lengths: list[int] = []
            for doc in _passages(source):
                record = orjson.dumps([doc.id, doc.title, doc.contents])
                docs_out.write(record)
                offsets.append(offsets[-1] + len(record))
                bar.update(len(record))  # about the input's size: a progress bar, not an account
                tokens = tokenizer("\n".join([doc.title] * title_weight + [doc.contents]))
                flat.extend([vocab.setdefault(t, len(vocab)) for t in tokens])
                chunk_lengths.append(len(tokens))
                if len(chunk_lengths) == chunk_docs:
                    spill.add(flat, chunk_lengths, first_doc=len(lengths))
                    lengths.extend(chunk_lengths)
                    flat, chunk_lengths = [], []
            if chunk_lengths:
                spill.add(flat, chunk_lengths, first_doc=len(lengths))
                lengths.extend(chunk_lengths)
        bar.close()
        if not lengths:
            raise CorpusError(f"corpus file {source} has no passages")
        np.save(work / DOCS_OFFSETS, np.frombuffer(offsets, dtype=np.int64).astype(np.uint64))
        num_postings = _write_scores(
            work, spill, np.frombuffer(lengths, dtype=np.int64), vocab, k1, b, progress
        )
        manifest = Manifest(
            format=FORMAT,
            num_docs=len(lengths),
            num_terms=len(vocab),
            num_postings=num_postings,
            tokenizer=tokenizer.name,
            k1=k1,
            b=b,
            title_weight=title_weight,
            source=str(source),
            build_s=round(time.perf_counter() - started, 1),
        )
        shutil.rmtree(work / "spill")
        np.save(work / TERM_MAX, _term_maxima(work))
        _write_manifest(work, manifest)
        if out.exists():
            shutil.rmtree(out)
        os.rename(work, out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Spill:
    """Per-chunk postings ``(term, doc, tf)``, sorted by doc then term, saved to disk."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.directory = directory
        self.files: list[Path] = []
        self.df = np.zeros(0, dtype=np.int64)

    def add(self, flat: list[int], lengths: list[int], first_doc: int) -> None:
        terms = np.asarray(flat, dtype=np.int64)
        docs = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        keys, tf = np.unique((docs << 32) | terms, return_counts=True)  # one entry per (doc, term)
        term = (keys & 0xFFFFFFFF).astype(np.int32)
        doc = ((keys >> 32) + first_doc).astype(np.int32)
        df = np.bincount(term, minlength=max(len(self.df), int(term.max(initial=-1)) + 1))
        df[: len(self.df)] += self.df
        self.df = df
        path = self.directory / f"{len(self.files):06d}.npz"
        np.savez(path, term=term, doc=doc, tf=tf.astype(np.int32))
        self.files.append(path)


def _write_scores(
    work: Path, spill: _Spill, lengths: np.ndarray, vocab: dict[str, int], k1: float, b: float, progress: bool
) -> int:
    """The CSC score matrix (terms x docs) in bm25s's layout, scattered chunk by chunk."""
    num_docs, num_terms = len(lengths), len(vocab)
    df = np.zeros(num_terms, dtype=np.int64)
    df[: len(spill.df)] = spill.df
    # bm25s's lucene BM25, with its operations and dtypes: idf in float32, the rest in float64
    idf = np.array([math.log(1 + (num_docs - d + 0.5) / (d + 0.5)) for d in df.tolist()], dtype=np.float32)
    avg_len = lengths.mean()
    indptr = np.zeros(num_terms + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    total = int(indptr[-1])
    target = work / BM25_DIR
    target.mkdir()
    data = np.lib.format.open_memmap(target / "data.csc.index.npy", "w+", np.float32, (total,))
    indices = np.lib.format.open_memmap(target / "indices.csc.index.npy", "w+", np.int32, (total,))
    fill = indptr[:-1].copy()
    for path in tqdm(spill.files, desc="scoring", unit="chunk", disable=not progress):
        with np.load(path) as chunk:
            term, doc, tf = chunk["term"], chunk["doc"], chunk["tf"].astype(np.float32)
        tfc = tf / (k1 * ((1 - b) + b * lengths[doc] / avg_len) + tf)
        score = (idf[term] * tfc).astype(np.float32)
        order = np.argsort(term, kind="stable")  # docs stay ascending within a term
        term_sorted = term[order]
        counts = np.bincount(term_sorted, minlength=num_terms)
        group_start = np.cumsum(counts) - counts
        dest = fill[term_sorted] + (np.arange(len(order)) - group_start[term_sorted])
        data[dest] = score[order]
        indices[dest] = doc[order]
        fill += counts
    data.flush()
    indices.flush()
    del data, indices
    np.save(target / "indptr.csc.index.npy", indptr)
    (target / "vocab.index.json").write_text(json.dumps(vocab, ensure_ascii=False))
    params = {
        "k1": k1,
        "b": b,
        "delta": 0.5,
        "method": "lucene",
        "idf_method": "lucene",
        "dtype": "float32",
        "int_dtype": "int32",
        "num_docs": num_docs,
        "version": bm25s.__version__,
        "backend": "numpy",
    }
    (target / "params.index.json").write_text(json.dumps(params, indent=4))
    return total


def _term_maxima(directory: Path) -> np.ndarray:
    indptr = np.load(directory / BM25_DIR / "indptr.csc.index.npy")
    return term_maxima(indptr, np.load(directory / BM25_DIR / "data.csc.index.npy", mmap_mode="r"))


def _write_manifest(directory: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically (a new file: a hard-linked copy of the index keeps its own)."""
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    os.replace(tmp, directory / MANIFEST)


def upgrade_index(directory: str | os.PathLike[str]) -> Manifest:
    """Bring a saved index of an older format to the current one, in place.

    Format 1 has a best-first copy of the postings, which is deleted, and no term maxima.
    """
    directory = Path(directory)
    manifest = _read_manifest(directory)
    if manifest.format == _FORMAT_1:
        np.save(directory / TERM_MAX, _term_maxima(directory))
        _write_manifest(directory, replace(manifest, format=FORMAT))
        for name in _FORMAT_1_ONLY:
            (directory / name).unlink(missing_ok=True)
    return load_manifest(directory)


# ------------------------------------------------------------------------- open


def _read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        return Manifest(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise SearchIndexError(f"{directory} is not a search index: {MANIFEST} is missing") from None
    except (ValueError, TypeError) as exc:
        raise SearchIndexError(f"{path} is not a valid manifest: {exc}") from None


def load_manifest(directory: str | os.PathLike[str]) -> Manifest:
    """The manifest of a saved index, after checking that every file it needs is there."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SearchIndexError(
            f"search index directory {directory} does not exist; build it with "
            f"`python -m tools.search.index build PASSAGES.jsonl {directory}`"
        )
    manifest = _read_manifest(directory)
    if manifest.format != FORMAT:
        how = (
            f"upgrade it in place with `python -m tools.search.index upgrade {directory}`"
            if manifest.format == _FORMAT_1
            else f"rebuild it with `python -m tools.search.index build PASSAGES.jsonl {directory}`"
        )
        raise SearchIndexError(
            f"{directory} has index format {manifest.format!r}; this version reads {FORMAT!r}: {how}"
        )
    needed = [
        *(f"{BM25_DIR}/{n}" for n in ("params.index.json", "vocab.index.json")),
        *(f"{BM25_DIR}/{n}.csc.index.npy" for n in ("data", "indices", "indptr")),
        DOCS_BIN,
        DOCS_OFFSETS,
        TERM_MAX,
    ]
    missing = [name for name in needed if not (directory / name).is_file()]
    if missing:
        raise SearchIndexError(f"search index {directory} is incomplete: missing {', '.join(missing)}")
    return manifest


class DocStore:
    """The passages of a saved index, decoded one at a time from a memory map."""

    def __init__(self, directory: Path) -> None:
        self._offsets = np.load(directory / DOCS_OFFSETS, mmap_mode="r")
        with open(directory / DOCS_BIN, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        if len(self._offsets) < 1 or int(self._offsets[-1]) != size:
            raise SearchIndexError(f"{directory / DOCS_BIN} does not match {DOCS_OFFSETS} (truncated copy?)")

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, position: int) -> Document:
        start, end = int(self._offsets[position]), int(self._offsets[position + 1])
        doc_id, title, contents = orjson.loads(self._map[start:end])
        return Document(doc_id, title, contents)


# -------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.search.index", description="Build or inspect a saved BM25 search index."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="index a JSONL of passages into a directory")
    build.add_argument("corpus", type=Path, help='JSONL: {"id","title","text"} or {"id","contents"} per line')
    build.add_argument("out", type=Path, help="index directory to write (replaced if it exists)")
    build.add_argument("--stemmer", default="auto", help="PyStemmer language, 'auto' or 'none'")
    build.add_argument("--k1", type=float, default=1.5)
    build.add_argument("--b", type=float, default=0.75)
    build.add_argument("--title-weight", type=int, default=2, help="times the title is indexed")
    build.add_argument("--chunk-docs", type=int, default=50_000, help="passages tokenised per spilled chunk")
    info = sub.add_parser("info", help="print a saved index's manifest and size on disk")
    info.add_argument("index", type=Path)
    upgrade = sub.add_parser("upgrade", help="bring an index of an older format to this one, in place")
    upgrade.add_argument("index", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            manifest = build_index(
                args.corpus,
                args.out,
                stemmer=None if args.stemmer == "none" else args.stemmer,
                k1=args.k1,
                b=args.b,
                title_weight=args.title_weight,
                chunk_docs=args.chunk_docs,
            )
        elif args.command == "upgrade":
            manifest = upgrade_index(args.index)
        else:
            manifest = load_manifest(args.index)
    except (CorpusError, SearchIndexError) as exc:
        parser.exit(2, f"error: {exc}\n")
    directory = args.out if args.command == "build" else args.index
    size = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    print(json.dumps({**asdict(manifest), "size_bytes": size, "directory": str(directory)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
