"""What the kiln tools need from a kiln: the `KilnBackend` protocol and its result models.

`mcp_bridge` never imports `crucible`; `crucible.kiln_mcp` implements this protocol on top
of `crucible.kiln`. Every method except `watch_changes` is synchronous and may block (disk,
Chroma, the embedder): the tools always call them through `anyio.to_thread.run_sync`.

Every path crossing this boundary is kiln-relative with `/` separators, and every error
message a backend raises (`KilnError`) must already be safe to show to an agent: no
absolute path of the machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic.json_schema import SkipJsonSchema


class KilnError(Exception):
    """A refusal or failure whose message is safe to show to an agent as is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class NoteNotFoundError(KilnError):
    """The note does not exist (or was deleted since it was listed or found)."""


class EditConflictError(KilnError):
    """The note changed since the caller read it (its hash no longer matches)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoteData(_Model):
    """A note as read from disk."""

    path: str
    text: str = Field(description="the whole file, frontmatter included")
    frontmatter: dict[str, Any]
    title: str
    tags: list[str]
    links: list[str]
    headings: list[str]
    content_hash: str
    size_bytes: int
    modified: str = Field(description="last modification time, ISO 8601 UTC")
    problems: list[str] = Field(default_factory=list, description="e.g. frontmatter that did not parse")


class WriteOutcome(_Model):
    path: str
    content_hash: str | None = Field(description="the new hash; null after a delete")
    size_bytes: int
    replaced: bool = Field(default=False, description="an existing note was overwritten")


class NoteEntry(_Model):
    path: str
    size_bytes: int
    modified: str


class LineMatch(_Model):
    line: int  # 1-based
    text: str


class SearchHit(_Model):
    """One note in a search result, from the search itself to the tool and the CLI.

    The tools send the command-line contract's five fields; `line` and `matches` are for the
    person at `cru kiln search` (`to_json`), so they are left out of the tool's schema."""

    path: str
    title: str
    score: float
    heading: str | None = None
    snippet: str
    line: SkipJsonSchema[int | None] = Field(default=None, exclude=True)  # where the snippet starts
    matches: SkipJsonSchema[list[LineMatch] | None] = Field(default=None, exclude=True)  # text search

    def to_json(self) -> dict[str, Any]:
        """Every field that is known (the CLI's `--json`)."""
        data = self.model_dump(mode="json", exclude_none=True)
        if self.line is not None:
            data["line"] = self.line
        if self.matches is not None:
            data["matches"] = [m.model_dump() for m in self.matches]
        return data


class SearchResults(_Model):
    results: list[SearchHit]


def shown_percent(share: float) -> int:
    """A share embedded (0-1) as the percent every place shows it: cut, not rounded (99.7% is
    not done), past the float's error (0.29 * 100 is 28.999…)."""
    return int(share * 100 + 1e-6)


def shown_duration(seconds: float) -> str:
    """A wait as every place says it: seconds under a minute, else whole minutes."""
    minutes = round(seconds / 60)
    return f"{round(seconds)} s" if minutes < 1 else "1 minute" if minutes == 1 else f"{minutes} minutes"


class IndexShare(_Model):
    """How much of the kiln a ranked search could search by meaning."""

    embedded: float = Field(description="share of the kiln's notes searchable by meaning so far (0-1); "
                                        "the rest are found by their words while the index builds")
    notes: int = Field(description="notes in the kiln")
    problem: str | None = Field(default=None, description="why the kiln's index cannot be searched by meaning "
                                                         "now, and its fix (absent when it can)")
    stopped: str | None = Field(default=None, description="why the index's build stopped before every note was "
                                                         "embedded (the embedded ones are searched by meaning, the "
                                                         "rest by their words); absent while it builds or is done")
    retry_in: int | None = Field(default=None, description="with `stopped`: seconds until this session tries the build "
                                                           "again by itself (absent when it will not)")

    @model_serializer(mode="wrap")
    def _without_no_problem(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("problem", "stopped", "retry_in"):
            if data.get(key) is None:
                data.pop(key, None)  # {"embedded", "notes"} as before, on every usable index
        return data


class RankedResults(SearchResults):
    """semantic_search's answer: the notes, and how far the kiln's index is."""

    index: IndexShare
    # The summary line, in the structured result too (filled in from `index` when serialised):
    # Claude Code gives its model the structuredContent alone (FIELD-NOTES).
    notice: str | None = Field(default=None, description="while the index is incomplete or unusable, what "
                                                         "that means for these results (absent once it is complete)")

    @model_serializer(mode="wrap")
    def _with_notice(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data.pop("notice", None)
        if (line := self.summary_line()) is not None:
            data["notice"] = line
        return data

    def summary_line(self) -> str | None:
        """One line for the text content while the index is incomplete or unusable (None once
        complete)."""
        if self.index.problem is not None:
            return (f"Index: the kiln's index cannot be searched by meaning: {self.index.problem} "
                    "Until then these notes were matched by their words only.")
        if self.index.embedded >= 1.0:
            return None
        if self.index.stopped is not None:
            again = (f"this session tries the build again in {shown_duration(self.index.retry_in)}, or "
                     if self.index.retry_in is not None else "")
            return (f"Index: {shown_percent(self.index.embedded)}% of the kiln's {self.index.notes} notes are embedded; the "
                    f"index's build stopped ({self.index.stopped}): the others were matched by their words "
                    f"only ({again}`cru kiln index` embeds them).")
        return (f"Index: {shown_percent(self.index.embedded)}% of the kiln's {self.index.notes} notes are embedded so "
                "far; the others were matched by their words only (the index builds in the background).")


class KilnInfo(_Model):
    name: str
    total_files: int
    markdown_files: int
    total_size_bytes: int


class KilnRoot(_Model):
    uri: str
    name: str


class KilnStats(_Model):
    name: str
    markdown_files: int
    other_files: int
    folders: int
    total_size_bytes: int
    markdown_size_bytes: int
    tags: int = Field(description="distinct tags across all notes")
    links: int = Field(description="wikilinks across all notes")
    last_modified: str | None = Field(description="newest note's modification time, ISO 8601 UTC")
    index: dict[str, Any] = Field(description="the search index's state: opened, phase, embedded share, "
                                             "notes, chunks, stale notes")


ProgressFn = Callable[[float, float | None, str], None]
"""`(done, total, message)`: called from the worker thread while an index opens or updates."""

ChangeFn = Callable[[list[str]], Awaitable[None]]
"""Called on the event loop with the kiln-relative paths of notes that changed."""


@runtime_checkable
class KilnBackend(Protocol):
    """A kiln, as the tools see it. Blocking methods; see the module docstring."""

    @property
    def name(self) -> str: ...

    def redact(self, text: str) -> str:
        """Remove any absolute path of the machine from a message (the last safety net)."""
        ...

    def read_note(self, path: str) -> NoteData: ...

    def create_note(
        self, path: str, body: str, frontmatter: dict[str, Any] | None, *, overwrite: bool
    ) -> WriteOutcome: ...

    def update_note(
        self,
        path: str,
        *,
        frontmatter: dict[str, Any] | None,
        remove_keys: list[str],
        body: str | None,
        expected_hash: str | None,
    ) -> WriteOutcome: ...

    def delete_note(self, path: str, *, expected_hash: str | None) -> WriteOutcome: ...

    def list_notes(self, folder: str) -> list[NoteEntry]:
        """Markdown notes under `folder` ("" = the kiln root), recursively, sorted by path."""
        ...

    def index_ready(self) -> bool:
        """True once a search need not wait for the index to open: it is open, or the kiln has
        no vectors yet and searches answer by words (reading them first: seconds at most)."""
        ...

    def open_index(self, progress: ProgressFn) -> None:
        """Open the search index (seconds: searches answer by words at once, and by meaning as
        the vectors are built in the background); the first search calls it."""
        ...

    def semantic_search(self, query: str, limit: int) -> RankedResults: ...

    def text_search(
        self, query: str, limit: int, *, regex: bool, case_sensitive: bool
    ) -> list[SearchHit]: ...

    def property_search(
        self,
        query: str | None,
        *,
        key: str | None,
        value: str | None,
        tag: str | None,
        limit: int,
    ) -> list[SearchHit]: ...

    def kiln_info(self) -> KilnInfo: ...

    def kiln_roots(self) -> list[KilnRoot]: ...

    def kiln_stats(self) -> KilnStats: ...

    async def watch_changes(self, on_change: ChangeFn, on_armed: Callable[[], None] | None = None) -> None:
        """Run until cancelled, calling `on_change` with the notes that changed on disk, and
        `on_armed` once the watch is in place (no change made after that is missed)."""
        ...
