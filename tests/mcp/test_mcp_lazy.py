"""`cru mcp` answers initialize, tools/list and note tools without loading the index stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, sys, trio
from pathlib import Path
from mcp.client.client import Client
from crucible.kiln_mcp import build_bridge

async def main():
    bridge = build_bridge(Path(sys.argv[1]))
    async with Client(bridge.server, mode="legacy") as c:
        await c.list_tools()
        await c.call_tool("read_note", {"path": "Index.md"})
        await c.call_tool("list_notes", {})
        await c.call_tool("get_kiln_info", {})
    heavy = sorted(m for m in ("chromadb", "onnxruntime", "tokenizers", "numpy", "crucible.kiln.index",
                               "crucible.kiln.embedder", "hypercorn") if m in sys.modules)
    print(json.dumps(heavy))

trio.run(main)
"""


def test_no_heavy_imports_before_the_first_search(mcp_kiln: Path, cru_env: dict[str, str]) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(mcp_kiln)], capture_output=True, text=True,
                         env=cru_env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_a_search_by_words_loads_no_vector_store(cru_env: dict[str, str]) -> None:
    """The first searches answer by words while the index thread imports chromadb: a search that
    imported it too raced that thread, and two threads importing chromadb at once deadlock on its
    circular imports (CI caught it: `_DeadlockError`, then the index thread's ImportError, and the
    index never built). Nor should a search by words wait a second for the vector store to load."""
    code = ("import json, sys; import crucible.kiln.search, crucible.kiln.late_interaction; "
            "print(json.dumps(sorted(m for m in ('chromadb', 'crucible.kiln.store', 'crucible.kiln.index') "
            "if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cru_env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []
