"""Saved conversations at scale, and Ctrl-C in `cru chat -p`, each against a peer in the same run.

1. `cru session list` and `cru session search WORD` over N saved conversations (each a few
   turns of prose plus a flood-sized answer), end to end (the real command, a fresh process),
   against `grep -rli WORD` over the same folder: the plain-text peer a person would reach for.
   search ranks (BM25 over titles and full text, with the line that matched); grep only says
   which files contain the word.
2. Ctrl-C while the agent starts (`cru chat -p` against the scripted agent delaying its
   initialize answer): time from SIGINT to exit, against the same command's time to exit on
   its own after a one-turn run (`cru chat -p` start to finish, the agent answering at once).

    python bench/sessions.py [--conversations 500] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = ROOT / "fixtures" / "scripted_agent.py"
CRU = str(Path(sys.executable).parent / "cru")
WORDS = ("garden tomato seedling compost river bridge kernel compiler lisbon tram sourdough starter "
         "ledger invoice telescope orbit violin sonata harbour lantern glacier meadow").split()


def make_store(root: Path, n: int, rng: random.Random) -> None:
    sys.path.insert(0, str(ROOT))
    from crucible.session_store import SessionMeta, SessionStore

    store = SessionStore(root)
    for i in range(n):
        sid = f"20260101-{i:06d}-{rng.randrange(16**6):06x}"
        w = store.create(SessionMeta(id=sid, agent=rng.choice(["claude", "opencode", "gemini"]), created=i,
                                     updated=i, cwd="/work"))
        for _turn in range(rng.randrange(2, 6)):
            w.append({"type": "user_message", "text": " ".join(rng.choices(WORDS, k=12))})
            w.append({"type": "agent_message", "text": " ".join(rng.choices(WORDS, k=rng.randrange(50, 2000)))})
            w.append({"type": "tool_call", "id": "t", "title": "semantic_search", "kind": "search",
                      "status": "completed"})
            w.append({"type": "turn_end", "stop_reason": "end_turn"})
        w.close()


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_store(n: int, runs: int) -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_DATA_HOME": tmp}
        root = Path(tmp) / "crucible" / "sessions"
        make_store(root, n, rng)
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        listing = [timed([CRU, "session", "list"], env) for _ in range(runs)]
        search = [timed([CRU, "session", "search", "sourdough starter"], env) for _ in range(runs)]
        grep = [timed(["grep", "-rli", "sourdough", str(root)], env) for _ in range(runs)]
        print(f"{n} conversations, {size / 1e6:.1f} MB on disk, median of {runs} runs:")
        print(f"  cru session list            {median(listing) * 1000:7.0f} ms")
        print(f"  cru session search          {median(search) * 1000:7.0f} ms")
        print(f"  grep -rli (peer)            {median(grep) * 1000:7.0f} ms")
        print(f"  search / grep               {median(search) / median(grep):7.1f}x")
        print(f"  list / search               {median(listing) / median(search):7.2f}x")


def bench_sigint(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_DATA_HOME": tmp}
        kiln = Path(tmp) / "kiln"
        kiln.mkdir()
        quick = Path(tmp) / "quick.json"
        quick.write_text("{}")
        slow = Path(tmp) / "slow.json"
        slow.write_text(json.dumps({"initialize": {"delay": 60}, "log": str(Path(tmp) / "log.jsonl")}))
        whole = [timed([CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {quick}", "--kiln", str(kiln),
                        "-p", "hi"], env) for _ in range(runs)]
        to_exit = []
        for _ in range(runs):
            log = Path(tmp) / "log.jsonl"
            log.unlink(missing_ok=True)
            proc = subprocess.Popen([CRU, "chat", "--agent-command", f"{sys.executable} {SCRIPTED} {slow}",
                                     "--kiln", str(kiln), "-p", "hi"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            while not (log.exists() and "initialize" in log.read_text()):
                time.sleep(0.02)
            start = time.perf_counter()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            to_exit.append(time.perf_counter() - start)
        print(f"cru chat -p, median of {runs} runs:")
        print(f"  Ctrl-C while starting -> exit {median(to_exit) * 1000:7.0f} ms")
        print(f"  a whole one-turn run (peer)    {median(whole) * 1000:7.0f} ms")
        print(f"  ratio                          {median(to_exit) / median(whole):7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    bench_store(args.conversations, args.runs)
    bench_sigint(args.runs)


if __name__ == "__main__":
    main()
