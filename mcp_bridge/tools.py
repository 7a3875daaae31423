"""The kiln tools: one `ToolSpec` each (argument model, handler, result model, annotations).

The JSON schema a client sees is the argument model's; the structured result is the result
model, and the text content is the same JSON. A handler raises `ToolError` (or a backend's
`KilnError`) for a refusal the agent should read; the dispatcher (`mcp_bridge.dispatch`)
turns every failure into an `isError` result with the real message, so the server keeps serving.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mcp_bridge.kiln_api import (
    KilnBackend,
    KilnInfo,
    KilnRoot,
    KilnStats,
    NoteEntry,
    RankedResults,
    SearchHit,
    SearchResults,
)

logger = logging.getLogger("mcp_bridge.tools")

DEFAULT_TOOL_TIMEOUT = 30.0
T = TypeVar("T")


class ToolError(Exception):
    """A failure the agent should read: the message becomes the `isError` result's text."""


ProgressReporter = Callable[[float, float | None, str | None], Awaitable[None]]
# Ask the person on behalf of an upstream MCP server (its name, its elicitation/create params).
ElicitFn = Callable[[str, types.ElicitRequestParams], Awaitable[types.ElicitResult]]


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


@dataclass
class ToolContext:
    """What a handler gets besides its arguments. `extra` carries per-session state (the
    lead's delegation tools keep their session there)."""

    tool_name: str
    backend: KilnBackend | None
    report_progress: ProgressReporter = _no_progress
    extra: dict[str, Any] = field(default_factory=dict)
    # Who answers an upstream's elicitation during this call (None: declined).
    elicit: ElicitFn | None = None
    # The call's time limit, set by the dispatcher (time spent asking the person is added back).
    deadline: anyio.CancelScope | None = None

    @property
    def kiln(self) -> KilnBackend:
        if self.backend is None:
            raise ToolError(f"Tool '{self.tool_name}' needs a kiln, and this server has none")
        return self.backend

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call in a worker thread; a timeout abandons it instead of waiting."""
        return await anyio.to_thread.run_sync(lambda: func(*args, **kwargs), abandon_on_cancel=True)


Handler = Callable[[ToolContext, Any], Awaitable[BaseModel]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[BaseModel]
    result: type[BaseModel]
    handler: Handler
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False
    title: str | None = None
    # Runs before the time limit starts (the first search waits for the index to load, with
    # progress notifications, however long a first build takes).
    prepare: Callable[[ToolContext], Awaitable[None]] | None = None
    # Overrides the server's tool timeout (a delegated child session runs for minutes).
    timeout: float | None = None

    kind = "kiln"  # what the dispatcher reports (kiln and the session's own tools alike)

    def validate(self, arguments: dict[str, Any] | None) -> BaseModel:
        """The arguments as the argument model, or a `ToolError` naming what is wrong."""
        try:
            return self.args.model_validate(arguments or {})
        except ValidationError as err:
            raise ToolError(describe_validation_error(self.name, self.args, err)) from None

    async def run(self, ctx: ToolContext, args: BaseModel) -> types.CallToolResult:
        return model_result(await self.handler(ctx, args))

    def to_mcp(self) -> types.Tool:
        # Built once per spec: every tools/list would otherwise regenerate the JSON schemas
        # (~1.5 ms a tool), the bulk of a listing's time.
        cached = _LISTED.get(self)
        if cached is None:
            cached = _LISTED[self] = self._build_mcp()
        return cached

    def _build_mcp(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.args),
            output_schema=self.result.model_json_schema(),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                # The spec defaults destructiveHint to true; say false explicitly for additive tools.
                destructive_hint=None if self.read_only else self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=self.open_world,
            ),
        )


_LISTED: weakref.WeakKeyDictionary[ToolSpec, types.Tool] = weakref.WeakKeyDictionary()


# --- schemas and argument errors ---------------------------------------------------------


def _simplify(node: Any) -> Any:
    """Plain JSON schema for picky clients: no titles, `anyOf [X, null]` -> X (still optional)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: _simplify(prop) for name, prop in value.items()}
                continue
            out[key] = _simplify(value)
        any_of = out.get("anyOf")
        if isinstance(any_of, list):
            kept = [s for s in any_of if s != {"type": "null"}]
            if len(kept) == 1 and len(kept) < len(any_of):
                del out["anyOf"]
                merged = dict(kept[0])
                merged.update(out)
                if merged.get("default", 0) is None:
                    del merged["default"]
                return merged
        return out
    if isinstance(node, list):
        return [_simplify(item) for item in node]
    return node


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = _simplify(model.model_json_schema())
    schema.setdefault("properties", {})  # never an empty schema, even for a no-argument tool
    schema["type"] = "object"
    schema["additionalProperties"] = False
    return dict(schema)


_KIND = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "an object",
    "array": "a list",
}


def _expected(model: type[BaseModel], name: str) -> str:
    prop = input_schema(model)["properties"].get(name, {})
    kind = _KIND.get(str(prop.get("type")), "a value")
    desc = prop.get("description")
    return f"{kind} ({desc})" if desc else kind


def describe_validation_error(tool: str, model: type[BaseModel], err: ValidationError) -> str:
    """One line per problem, naming the argument and what is expected."""
    accepted = ", ".join(input_schema(model)["properties"]) or "none"
    lines: list[str] = []
    for e in err.errors(include_url=False):
        loc = [str(p) for p in e["loc"]]
        name = loc[0] if loc else ""
        where = ".".join(loc)
        if e["type"] == "missing":
            lines.append(f"missing required argument '{where}': expected {_expected(model, name)}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"unknown argument {where[:200]!r} (accepted: {accepted})")
        elif not loc:
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            got = json.dumps(e.get("input"), default=str)
            got = got if len(got) <= 60 else got[:57] + "..."
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"argument '{where}': {msg}; expected {_expected(model, name)}, got {got}")
    return f"Invalid arguments for tool '{tool}': " + "; ".join(lines)


# --- results -------------------------------------------------------------------------------


def _text_result(text: str, *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error)


def error_result(message: str) -> types.CallToolResult:
    return _text_result(message, is_error=True)


def model_result(model: BaseModel) -> types.CallToolResult:
    data = model.model_dump(mode="json")
    content = [types.TextContent(text=json.dumps(data, ensure_ascii=False))]
    # A result may add one line for the reader after its JSON (semantic_search: how far the
    # index is), as a second text block so the first stays the JSON of structuredContent.
    summary = getattr(model, "summary_line", None)
    line = summary() if callable(summary) else None
    if line:
        content.append(types.TextContent(text=line))
    return types.CallToolResult(content=list(content), structured_content=data)


def _redact(ctx: ToolContext, text: str) -> str:
    return ctx.backend.redact(text) if ctx.backend is not None else text


# --- argument and result models -------------------------------------------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


_PATH = Field(description="kiln-relative path of a markdown note, e.g. 'Projects/Idea.md'")
_LIMIT = Field(default=10, ge=1, le=100, description="how many notes to return (1-100)")


class NoArgs(_Args):
    pass


class PathArgs(_Args):
    path: str = _PATH


class CreateNoteArgs(_Args):
    path: str = _PATH
    content: str = Field(default="", description="markdown body of the note (without frontmatter)")
    frontmatter: dict[str, Any] | None = Field(default=None, description="YAML frontmatter properties")
    overwrite: bool = Field(default=False, description="replace the note if it already exists")


class ReadNoteArgs(_Args):
    path: str = _PATH
    start_line: int | None = Field(default=None, ge=1, description="first line to return (1-based)")
    end_line: int | None = Field(default=None, ge=1, description="last line to return (inclusive)")

    @model_validator(mode="after")
    def _range(self) -> ReadNoteArgs:
        if self.start_line and self.end_line and self.end_line < self.start_line:
            raise ValueError(
                f"end_line ({self.end_line}) is before start_line ({self.start_line})"
            )
        return self


class UpdateNoteArgs(_Args):
    path: str = _PATH
    frontmatter: dict[str, Any] | None = Field(
        default=None, description="properties to set; merged into the existing frontmatter"
    )
    remove_keys: list[str] = Field(default_factory=list, description="frontmatter properties to remove")
    body: str | None = Field(default=None, description="new markdown body (the frontmatter is kept)")
    expected_hash: str | None = Field(
        default=None, description="content_hash from your last read; refuses if the note changed since"
    )

    @model_validator(mode="after")
    def _something(self) -> UpdateNoteArgs:
        if self.frontmatter is None and not self.remove_keys and self.body is None:
            raise ValueError("nothing to update: give 'frontmatter', 'remove_keys' or 'body'")
        return self


class DeleteNoteArgs(_Args):
    path: str = _PATH
    expected_hash: str | None = Field(
        default=None, description="content_hash from your last read; refuses if the note changed since"
    )


def _root_folder(value: Any) -> Any:
    # Agents send the string "null" (or "") for "no folder": all mean the kiln root.
    if value is None or (isinstance(value, str) and value.strip() in ("", "null", "/", ".")):
        return ""
    return value


class ListNotesArgs(_Args):
    folder: str | None = Field(default=None, description="folder to list, recursively (default: the kiln root)")
    pattern: str | None = Field(default=None, description="glob on the note's path or name, e.g. '*meeting*'")
    limit: int = Field(default=100, ge=1, le=1000, description="notes per page (1-1000)")
    cursor: str | None = Field(default=None, description="next_cursor from the previous page")

    _folder = field_validator("folder", mode="before")(_root_folder)


class SemanticSearchArgs(_Args):
    query: str = Field(min_length=1, description="what you are looking for, in plain words")
    limit: int = _LIMIT


class TextSearchArgs(_Args):
    query: str = Field(min_length=1, description="text (or a regular expression with regex=true)")
    limit: int = _LIMIT
    regex: bool = Field(default=False, description="treat the query as a regular expression")
    case_sensitive: bool = Field(default=False, description="match case exactly")


class PropertySearchArgs(_Args):
    query: str | None = Field(default=None, description="'key:value' or 'tag:name' or a value to find in any property")
    limit: int = _LIMIT
    key: str | None = Field(default=None, description="frontmatter property name")
    value: str | None = Field(default=None, description="property value to match (needs key, or any key)")
    tag: str | None = Field(default=None, description="a tag, with or without '#'")

    @model_validator(mode="after")
    def _something(self) -> PropertySearchArgs:
        if not (self.query or self.key or self.value or self.tag):
            raise ValueError("give 'query', or at least one of 'key', 'value', 'tag'")
        return self


class NoteWriteResult(BaseModel):
    path: str
    action: Literal["created", "overwritten", "updated", "deleted"]
    content_hash: str | None
    size_bytes: int


class ReadNoteResult(BaseModel):
    path: str
    content: str
    start_line: int
    end_line: int
    total_lines: int
    content_hash: str


class MetadataResult(BaseModel):
    path: str
    title: str
    frontmatter: dict[str, Any]
    tags: list[str]
    links: list[str]
    headings: list[str]
    content_hash: str
    size_bytes: int
    modified: str
    problems: list[str]


class ListNotesResult(BaseModel):
    notes: list[NoteEntry]
    total: int
    next_cursor: str | None


class KilnRootsResult(BaseModel):
    roots: list[KilnRoot]


# --- handlers ----------------------------------------------------------------------------


async def _create_note(ctx: ToolContext, a: CreateNoteArgs) -> NoteWriteResult:
    out = await ctx.run(ctx.kiln.create_note, a.path, a.content, a.frontmatter, overwrite=a.overwrite)
    return NoteWriteResult(
        path=out.path,
        action="overwritten" if out.replaced else "created",
        content_hash=out.content_hash,
        size_bytes=out.size_bytes,
    )


async def _read_note(ctx: ToolContext, a: ReadNoteArgs) -> ReadNoteResult:
    note = await ctx.run(ctx.kiln.read_note, a.path)
    lines = note.text.splitlines(keepends=True)
    total = len(lines)
    start = a.start_line or 1
    end = min(a.end_line or total, total)
    if total and start > total:
        raise ToolError(f"start_line {start} is past the end of '{note.path}' ({total} lines)")
    content = "".join(lines[start - 1 : end]) if total else ""
    return ReadNoteResult(
        path=note.path,
        content=content,
        start_line=start if total else 0,
        end_line=end,
        total_lines=total,
        content_hash=note.content_hash,
    )


async def _read_metadata(ctx: ToolContext, a: PathArgs) -> MetadataResult:
    note = await ctx.run(ctx.kiln.read_note, a.path)
    return MetadataResult(**note.model_dump(exclude={"text"}))


async def _update_note(ctx: ToolContext, a: UpdateNoteArgs) -> NoteWriteResult:
    out = await ctx.run(
        ctx.kiln.update_note,
        a.path,
        frontmatter=a.frontmatter,
        remove_keys=a.remove_keys,
        body=a.body,
        expected_hash=a.expected_hash,
    )
    return NoteWriteResult(path=out.path, action="updated", content_hash=out.content_hash, size_bytes=out.size_bytes)


async def _delete_note(ctx: ToolContext, a: DeleteNoteArgs) -> NoteWriteResult:
    out = await ctx.run(ctx.kiln.delete_note, a.path, expected_hash=a.expected_hash)
    return NoteWriteResult(path=out.path, action="deleted", content_hash=None, size_bytes=out.size_bytes)


def _parse_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        offset = int(cursor)
    except ValueError:
        offset = -1
    if offset < 0:
        raise ToolError(f"argument 'cursor': {cursor!r} is not a cursor this server gave; omit it to start over")
    return offset


def paginate(items: Sequence[T], cursor: str | None, limit: int) -> tuple[list[T], str | None]:
    offset = _parse_cursor(cursor)
    page = list(items[offset : offset + limit])
    nxt = offset + limit
    return page, (str(nxt) if nxt < len(items) else None)


async def _list_notes(ctx: ToolContext, a: ListNotesArgs) -> ListNotesResult:
    entries = await ctx.run(ctx.kiln.list_notes, a.folder or "")
    if a.pattern:
        pat = a.pattern
        entries = [
            e for e in entries
            if fnmatch.fnmatch(e.path, pat) or fnmatch.fnmatch(e.path.rsplit("/", 1)[-1], pat)
        ]
    page, nxt = paginate(entries, a.cursor, a.limit)
    return ListNotesResult(notes=page, total=len(entries), next_cursor=nxt)


async def ensure_index(ctx: ToolContext) -> None:
    """Open the index on the first search (seconds: it does not wait for the vectors), telling
    the client while it loads."""
    kiln = ctx.kiln
    if kiln.index_ready():
        return
    await ctx.report_progress(0, None, "Opening the kiln's search index (first search)")
    started = time.monotonic()

    def forward(done: float, total: float | None, message: str) -> None:
        async def send() -> None:
            await ctx.report_progress(done, total, message)

        anyio.from_thread.run(send)

    await ctx.run(kiln.open_index, forward)
    if kiln.index_ready():
        await ctx.report_progress(1, 1, f"Search index ready in {time.monotonic() - started:.1f} s")
    else:  # it cannot be opened, and the notes' words answer: the result says why and the fix
        await ctx.report_progress(1, 1, "The search index cannot be opened: searching by the notes' words")


def _finite(hits: list[SearchHit]) -> list[SearchHit]:
    for hit in hits:
        if not math.isfinite(hit.score):
            hit.score = 0.0
    return hits


async def _semantic_search(ctx: ToolContext, a: SemanticSearchArgs) -> RankedResults:
    found = await ctx.run(ctx.kiln.semantic_search, a.query, a.limit)
    found.results = _finite(found.results)
    return found


async def _text_search(ctx: ToolContext, a: TextSearchArgs) -> SearchResults:
    hits = await ctx.run(ctx.kiln.text_search, a.query, a.limit, regex=a.regex, case_sensitive=a.case_sensitive)
    return SearchResults(results=_finite(hits))


async def _property_search(ctx: ToolContext, a: PropertySearchArgs) -> SearchResults:
    hits = await ctx.run(
        ctx.kiln.property_search, a.query, key=a.key, value=a.value, tag=a.tag, limit=a.limit
    )
    return SearchResults(results=_finite(hits))


async def _kiln_info(ctx: ToolContext, a: NoArgs) -> KilnInfo:
    return await ctx.run(ctx.kiln.kiln_info)


async def _kiln_roots(ctx: ToolContext, a: NoArgs) -> KilnRootsResult:
    return KilnRootsResult(roots=await ctx.run(ctx.kiln.kiln_roots))


async def _kiln_stats(ctx: ToolContext, a: NoArgs) -> KilnStats:
    return await ctx.run(ctx.kiln.kiln_stats)


KILN_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "create_note",
        "Create a markdown note in the kiln (path must end in .md). Refuses to replace an "
        "existing note unless overwrite is true.",
        CreateNoteArgs, NoteWriteResult, _create_note, read_only=False, destructive=False,
    ),
    ToolSpec(
        "read_note",
        "Read a note's text (frontmatter included), optionally only lines start_line..end_line. "
        "Returns content_hash for a safe update_note.",
        ReadNoteArgs, ReadNoteResult, _read_note, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "read_metadata",
        "A note's frontmatter, title, tags, wikilinks and headings, without its body.",
        PathArgs, MetadataResult, _read_metadata, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "update_note",
        "Update a note: merge properties into its frontmatter, remove properties, and/or "
        "replace its body. Pass expected_hash from read_note to refuse if it changed meanwhile.",
        UpdateNoteArgs, NoteWriteResult, _update_note, read_only=False, destructive=True, idempotent=True,
    ),
    ToolSpec(
        "delete_note",
        "Delete a markdown note from the kiln.",
        DeleteNoteArgs, NoteWriteResult, _delete_note, read_only=False, destructive=True,
    ),
    ToolSpec(
        "list_notes",
        "List markdown notes under a folder (default: the whole kiln), optionally filtered by "
        "a glob pattern, a page at a time (pass next_cursor back as cursor).",
        ListNotesArgs, ListNotesResult, _list_notes, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "semantic_search",
        "Find notes by meaning (semantic and keyword search combined). Returns notes with the "
        "best matching section and a snippet.",
        SemanticSearchArgs, RankedResults, _semantic_search, read_only=True, idempotent=True,
        prepare=ensure_index,
    ),
    ToolSpec(
        "text_search",
        "Find notes containing text (or a regular expression), with the matching line as snippet.",
        TextSearchArgs, SearchResults, _text_search, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "property_search",
        "Find notes by frontmatter properties or tags: key/value, tag, or a query like "
        "'status:draft' or 'tag:project'.",
        PropertySearchArgs, SearchResults, _property_search, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "get_kiln_info",
        "The kiln's name and how many files and markdown notes it holds, and their total size.",
        NoArgs, KilnInfo, _kiln_info, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "get_kiln_roots",
        "The kiln's root(s) as URIs (notes are resources under kiln://notes/).",
        NoArgs, KilnRootsResult, _kiln_roots, read_only=True, idempotent=True,
    ),
    ToolSpec(
        "get_kiln_stats",
        "Statistics about the kiln: notes, folders, sizes, tags, links, last change, index state.",
        NoArgs, KilnStats, _kiln_stats, read_only=True, idempotent=True,
    ),
)


def log_to_stderr(level: int = logging.WARNING) -> None:
    """`cru mcp` logs to stderr only (stdout is the protocol on stdio)."""
    root = logging.getLogger("mcp_bridge")
    root.setLevel(level)
    if logging.getLogger().handlers:
        return  # the program's own handler (cru's makes every line terminal-safe) shows them
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cru mcp: %(message)s"))
    root.addHandler(handler)
