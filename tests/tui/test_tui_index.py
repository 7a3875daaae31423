"""Issue 15: `cru chat`'s status bar shows the kiln's index while it is built in the background
(`indexing 16%`), and not once it is ready; a failed build shows why, shortly; a rebuild by
another process (`cru kiln index --rebuild` in another terminal) shows too.

The embedder is a real HTTP server (fixtures/gated_embedder.py) that the test lets answer, so
the build (in its real worker process) stops where the test wants it and goes on when told."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Screen, TuiRunner, group_gone

from crucible.kiln.index import GROUP_NOTES, group_notes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from gated_embedder import GatedEmbedder  # noqa: E402

# One chunk each, and the index embeds and writes `group_notes(NOTES)` notes at a time: GROUPS
# groups, the last perhaps short, each PER_GROUP embedder requests (batch_size 32) or fewer,
# REQUESTS in all.
NOTES = 3 * GROUP_NOTES + 16
SIZE = group_notes(NOTES)
PER_GROUP = -(-SIZE // 32)
GROUPS = -(-NOTES // SIZE)
REQUESTS = sum(-(-min(SIZE, NOTES - k * SIZE) // 32) for k in range(GROUPS))
CTRL_D = "\x04"
INDEXING = re.compile(r"indexing (\d+)%")
OTHERS = re.compile(r"indexing (\d+)% \(another cru\)")


@pytest.fixture
def kiln(tmp_path: Path) -> Path:
    root = tmp_path / "kiln"
    for i in range(NOTES):
        path = root / f"part-{i // 50}" / f"note-{i:03d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Note {i}\n\nAbout the lantern and the word uniqueword{i}.\n")
    return root


@pytest.fixture
def embedder(tui: TuiRunner) -> Iterator[GatedEmbedder]:
    with GatedEmbedder() as server:
        config = Path(tui.env["XDG_CONFIG_HOME"]) / "crucible" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(server.config_toml())
        yield server


def status(screen: Screen) -> str:
    return screen.text().splitlines()[-1]  # the status bar is the screen's last row


def percent(screen: Screen) -> int | None:
    m = INDEXING.search(status(screen))
    return int(m.group(1)) if m else None


def shows_within(screen: Screen, pred: object, seconds: float) -> bool:
    try:
        screen.wait_for(lambda _s: pred(), timeout=seconds)  # type: ignore[operator]
    except AssertionError:
        if not screen.child.isalive():
            raise
        return False
    return True


def embed_some(screen: Screen, embedder: GatedEmbedder) -> int:
    """Let the build embed one group of notes at a time until the bar shows some embedded;
    the percent shown."""
    assert embedder.requested.wait(60)
    for _ in range(GROUPS):
        embedder.allow(PER_GROUP)
        if shows_within(screen, lambda: (percent(screen) or 0) > 0, 5):
            break
    shown = percent(screen)
    assert shown is not None and 0 < shown < 100, status(screen)
    return shown


def said_once(screen: Screen, notice: re.Pattern[str]) -> str:
    """The chat shows `notice` (wrapped over rows as it may be) once, and still once after the
    build's state has had time to change again; the screen read as one paragraph."""
    # A row that fills the width joins the next with no space (`Screen.unwrapped`), so a row
    # broken at the space just past the width loses it: the notice's spaces may be missing.
    loose = re.compile(notice.pattern.replace(" ", " ?"))
    screen.wait_for(lambda _s: loose.search(screen.unwrapped()) is not None, timeout=60)
    shows_within(screen, lambda: False, 2)  # the state sent again (a late progress) says nothing more
    told = screen.unwrapped()
    said = told.count("warning: the kiln's index") + told.count("warning: indexing the kiln")
    assert len(loose.findall(told)) == 1 and said == 1, told
    return told


def leave(screen: Screen) -> None:
    screen.send(CTRL_D)
    assert screen.wait_exit() == 0
    assert group_gone(screen.child.pid), "cru chat left processes behind"


def test_the_status_bar_shows_the_index_build_then_not(tui: TuiRunner, embedder: GatedEmbedder) -> None:
    screen = tui.open(None, cols=120)
    # Nothing embedded: the build waits on the embedder, the bar says how far it is.
    screen.wait_for(lambda _s: percent(screen) == 0 and "ready" in status(screen), timeout=60)
    # One group of notes at a time: the share goes up, and the chat answers meanwhile.
    embed_some(screen, embedder)
    screen.type_line("hello")
    screen.wait_for("echo: hello")
    assert percent(screen) is not None and embedder.answered < REQUESTS  # still building
    # The rest: the bar no longer speaks of the index once it is ready.
    embedder.open()
    screen.wait_for(lambda _s: "ready" in status(screen) and "index" not in status(screen), timeout=120)
    leave(screen)


def test_a_failed_index_shows_a_short_reason(tui: TuiRunner, embedder: GatedEmbedder) -> None:
    embedder.fail(500, '{"error": "model gated is not loaded"}')
    screen = tui.open(None, cols=120)
    bar = screen.wait_for(lambda _s: "index failed:" in status(screen), timeout=120).splitlines()[-1]
    reason = bar.split("index failed: ", 1)[1].strip()
    assert reason.startswith("the openai embedder answered HTTP 500"), bar
    assert "http://" not in reason and len(reason) <= 60, bar
    # The chat says it once, whole: the reason the bar cuts, and what searching does meanwhile.
    told = said_once(screen, re.compile(
        r"warning: the kiln's index cannot be used \(the openai embedder at http://127\.0\.0\.1:\d+\S* answered "
        r"HTTP 500[^)]*model gated is not loaded[^)]*\); searching the kiln matches words only\. "
        r"It is tried again in 1 minute; `cru kiln index` says how to mend it"))
    assert "indexing the kiln stopped" not in told
    leave(screen)


def test_a_build_that_stops_midway_shows_how_far_it_got_and_why(tui: TuiRunner, embedder: GatedEmbedder) -> None:
    """The embedder fails after some notes are embedded: those are searched by meaning, so the
    bar says where indexing stopped and why, not that the index failed as a whole."""
    screen = tui.open(None, cols=120)
    shown = embed_some(screen, embedder)
    embedder.fail(500, '{"error": "model gated is not loaded"}')
    bar = screen.wait_for(lambda _s: "indexing stopped at" in status(screen), timeout=120).splitlines()[-1]
    stopped = re.search(r"indexing stopped at (\d+)%: the openai embedder answered HTTP 500", bar)
    assert stopped is not None and shown <= int(stopped.group(1)) < 100, bar
    assert "index failed" not in bar
    told = said_once(screen, re.compile(
        r"warning: indexing the kiln stopped at (\d+)% \(the openai embedder at http://127\.0\.0\.1:\d+\S* answered "
        r"HTTP 500[^)]*model gated is not loaded[^)]*\); searching the kiln matches the notes embedded so far by "
        r"meaning too, the others by words only\. It is tried again in 1 minute, or `cru kiln index` embeds "
        r"the rest"))
    assert "cannot be used" not in told
    leave(screen)


@pytest.mark.parametrize("end", ["done", "kill -9"])
def test_the_status_bar_shows_another_crus_rebuild_then_not(
    tui: TuiRunner, embedder: GatedEmbedder, cru_bin: str, kiln: Path, end: str
) -> None:
    embedder.open()
    screen = tui.open(None, cols=120)
    screen.wait_for(lambda _s: embedder.answered >= REQUESTS and "ready" in status(screen)
                    and "index" not in status(screen), timeout=120)
    # Built. Now another terminal rebuilds the index; its embedding waits at the gate.
    embedder.shut()
    other = subprocess.Popen([cru_bin, "kiln", "index", "--rebuild", "--kiln", str(kiln)], env=tui.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # 0% at first (the store emptied), then the share its first groups of notes wrote
        def others() -> int:
            m = OTHERS.search(status(screen))
            return int(m.group(1)) if m else -1

        screen.wait_for(lambda _s: others() == 0, timeout=60)
        for _ in range(GROUPS):  # one group of notes at a time, as in the test above
            embedder.allow(PER_GROUP)
            if shows_within(screen, lambda: others() > 0, 5):
                break
        left_at = others()
        assert 0 < left_at < 100 and embedder.answered < 2 * REQUESTS, status(screen)
        if end == "done":
            # Stopped (Ctrl-Z in its terminal): it never goes on by itself; the bar says how
            other.send_signal(signal.SIGSTOP)
            screen.wait_for(lambda _s: f"(another cru, stopped: kill -CONT {other.pid})" in status(screen),
                            timeout=30)
            other.send_signal(signal.SIGCONT)
            screen.wait_for(lambda _s: others() >= left_at, timeout=30)
            embedder.open()
            _, err = other.communicate(timeout=120)
            assert other.returncode == 0, err
        else:
            # Stopped midway: the session builds the rest itself, from where it was left.
            other.kill()
            other.wait()
            asked = embedder.texts
            screen.wait_for(lambda _s: (percent(screen) or 0) >= left_at and others() == -1, timeout=30)
            embedder.open()
        # Done: the bar no longer speaks of the index.
        screen.wait_for(lambda _s: "index" not in status(screen), timeout=60)
        if end != "done":
            assert embedder.texts - asked < NOTES  # what the other wrote was not embedded again
    finally:
        if other.poll() is None:
            other.send_signal(signal.SIGCONT)
            other.kill()
            other.wait()
    leave(screen)
