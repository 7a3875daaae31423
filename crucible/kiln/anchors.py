"""What other notes say of a note: the words around the wikilinks that point to it.

A link is written where its target is described ("[[Basic Commands]] - the commands you will
type every day"), often in words the target itself does not use, which is how a person asks
who does not remember the note. Web search has ranked pages by the text of the links to them
for that reason since the 1990s (anchor text: Brin and Page 1998, Craswell et al. 2001); the
lexical index counts those words as a field of the target (see `lexical`).

Links resolve as Obsidian resolves them: a link names a note by its path from the kiln's root,
or by the end of that path (its file name, or folder/name), without `.md`, ignoring case. When
several notes end that way: the one with exactly that path, else the one under the linking
note's folder, else the shortest path. A note added or removed can change what a link names,
so the graph keeps, for each way of naming, the notes it names and the notes that use it.
"""

from __future__ import annotations

import posixpath

# A note's links: the key of each target (`link_key`) -> the terms written around its links.
LinkTerms = dict[str, dict[str, int]]


def link_key(target: str) -> str:
    """How a link's target is looked up: lower case, `/` separated, without `.md`."""
    key = target.strip().replace("\\", "/").strip("/").lower()
    return key[:-3] if key.endswith(".md") else key


def _names(path: str) -> list[str]:
    """Every key that can name the note at `path` (a kiln-relative `.md` path): the whole path,
    then each shorter end of it down to the file name."""
    parts = link_key(path).split("/")
    return ["/".join(parts[i:]) for i in range(len(parts))]


class LinkGraph:
    """The kiln's wikilinks, resolved, with the terms written around them. Each link (a linking
    note and a key) is bound to the note it names, so a note's incoming terms are a sum over
    its own links in; a note added or removed rebinds the links of its names once per batch
    (`take_dirty`). Not thread-safe: the lexical index's owner holds its lock."""

    def __init__(self) -> None:
        self.links: dict[str, LinkTerms] = {}  # by the linking note
        self._linkers: dict[str, set[str]] = {}  # key -> the notes with a link of that key
        self._bound: dict[tuple[str, str], str] = {}  # (linking note, key) -> the note it names
        self._into: dict[str, set[tuple[str, str]]] = {}  # a note -> the links bound to it
        self._named: dict[str, set[str]] = {}  # key -> the notes it can name
        self._paths: dict[str, str] = {}  # a note's whole key -> its path (one, if case differs)
        self._shortest: dict[str, str] = {}  # key -> the shortest path it names (a cache)
        self._renamed: set[str] = set()  # keys whose notes changed: their links to rebind
        self.dirty: set[str] = set()  # notes whose incoming terms may have changed

    def has(self, path: str) -> bool:
        return path in self._named.get(link_key(path), ())

    def add_note(self, path: str) -> None:
        for key in _names(path):
            self._named.setdefault(key, set()).add(path)
            self._shortest.pop(key, None)
            self._renamed.add(key)
        self._paths.setdefault(link_key(path), path)

    def remove_note(self, path: str) -> None:
        self.set_links(path, {})
        for key in _names(path):
            named = self._named.get(key)
            if named is None:
                continue
            named.discard(path)
            self._shortest.pop(key, None)
            if not named:
                del self._named[key]
            self._renamed.add(key)
        if self._paths.get(link_key(path)) == path:
            del self._paths[link_key(path)]

    def set_links(self, source: str, links: LinkTerms) -> None:
        """Replace the links of `source` (a note already added)."""
        for key in self.links.pop(source, {}):
            self._unbind(source, key)
            linkers = self._linkers[key]
            linkers.discard(source)
            if not linkers:
                del self._linkers[key]
        if links:
            self.links[source] = links
        for key in links:
            self._linkers.setdefault(key, set()).add(source)
            self._bind(source, key)

    def _bind(self, source: str, key: str) -> None:
        target = self.resolve(key, source)
        if target is not None and target != source:  # a link to itself says nothing new
            self._bound[(source, key)] = target
            self._into.setdefault(target, set()).add((source, key))
            self.dirty.add(target)

    def _unbind(self, source: str, key: str) -> None:
        target = self._bound.pop((source, key), None)
        if target is not None:
            into = self._into[target]
            into.discard((source, key))
            if not into:
                del self._into[target]
            self.dirty.add(target)

    def resolve(self, key: str, source: str) -> str | None:
        """The note a link of `key` in `source` names, if any."""
        named = self._named.get(key)
        if not named:
            return None
        if len(named) == 1:
            return next(iter(named))
        if (exact := self._paths.get(key)) is not None:
            return exact
        folder = posixpath.dirname(link_key(source))
        if folder and (near := self._paths.get(f"{folder}/{key}")) is not None:
            return near
        shortest = self._shortest.get(key)
        if shortest is None:
            shortest = self._shortest[key] = min(named, key=lambda p: (len(p), p))
        return shortest

    def incoming(self, target: str) -> dict[str, int]:
        """The terms written around the links to `target` from other notes, summed."""
        out: dict[str, int] = {}
        for source, key in self._into.get(target, ()):
            for term, n in self.links[source][key].items():
                out[term] = out.get(term, 0) + n
        return out

    def rebind(self) -> None:
        """Bind again the links of every key whose notes changed: once per key, however many
        notes of that name came or went."""
        for key in self._renamed:
            for source in self._linkers.get(key, ()):
                if self._bound.get((source, key)) != self.resolve(key, source):
                    self._unbind(source, key)
                    self._bind(source, key)
        self._renamed = set()

    def take_dirty(self) -> set[str]:
        """The notes whose incoming terms may have changed since the last call (the links
        rebound first)."""
        self.rebind()
        dirty, self.dirty = self.dirty, set()
        return dirty
