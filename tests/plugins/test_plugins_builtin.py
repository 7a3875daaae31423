"""The two plugins shipped with Crucible, against a copy of the fixture kiln: daily notes and a
TASKS.md task list."""

from __future__ import annotations

import json
import time
from pathlib import Path

from conftest import bridge_for, host_for, texts
from mcp.client.client import Client

TASKS = """# Tasks

- [x] Outline the book [id:: outline]
- [ ] Research the history [id:: research]
- [ ] Draft chapter one [id:: ch1] [deps:: outline, research]
* [ ] Buy coffee
- [ ] Print it [id:: print] [deps:: ch1]
"""


async def test_daily_today_and_append_with_a_template(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    host = host_for(tmp_path, env, '[plugins.daily]\nfolder = "Journal"\ntemplate = "# Day {{date}}\\n\\n## Notes\\n"\n')
    day = time.strftime("%Y-%m-%d")
    async with Client(bridge_for(kiln, host).server, mode="legacy") as c:
        r = await c.call_tool("lua_daily_today", {})
        assert r.structured_content == {"path": f"Journal/{day}.md", "exists": False,
                                        "content": f"# Day {day}\n\n## Notes\n"}
        assert not (kiln / "Journal").exists()  # reading creates nothing
        r = await c.call_tool("lua_daily_append_to_today", {"text": "fed the starter", "time": False})
        assert r.structured_content is not None and r.structured_content["action"] == "created"
        r = await c.call_tool("lua_daily_append_to_today", {"text": "baked"})
        assert r.structured_content is not None and r.structured_content["action"] == "overwritten"
        text = (kiln / "Journal" / f"{day}.md").read_text()
        lines = text.splitlines()
        assert lines[:4] == [f"# Day {day}", "", "## Notes", "- fed the starter"]
        assert lines[4].startswith("- ") and lines[4].endswith(" baked") and ":" in lines[4]
        r = await c.call_tool("lua_daily_today", {})
        assert r.structured_content is not None and r.structured_content["exists"] is True
        assert r.structured_content["content"] == text


async def test_daily_refuses_an_unknown_setting(tmp_path: Path, env: dict[str, str]) -> None:
    host = host_for(tmp_path, env, '[plugins.daily]\ncolour = "red"\n')
    daily = host.get("daily")
    assert daily is not None and daily.state == "failed"
    assert "unknown setting 'colour' (daily knows folder, format, template)" in (daily.reason or "")
    assert host.get("tasks") is not None and host.get("tasks").state == "loaded"  # type: ignore[union-attr]


async def test_tasks_list_next_and_mark_done(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    (kiln / "TASKS.md").write_text(TASKS)
    async with Client(bridge_for(kiln, host_for(tmp_path, env)).server, mode="legacy") as c:
        listed = json.loads(texts(await c.call_tool("lua_tasks_list_tasks", {})))
        assert [(t["id"], t["title"], t["done"], t["deps"]) for t in listed["tasks"]] == [
            ("outline", "Outline the book", True, []), ("research", "Research the history", False, []),
            ("ch1", "Draft chapter one", False, ["outline", "research"]), ("line-6", "Buy coffee", False, []),
            ("print", "Print it", False, ["ch1"])]
        assert [t["id"] for t in json.loads(texts(await c.call_tool(
            "lua_tasks_list_tasks", {"status": "done"})))["tasks"]] == ["outline"]
        nxt = json.loads(texts(await c.call_tool("lua_tasks_next_task", {})))
        assert nxt["task"]["id"] == "research"
        r = await c.call_tool("lua_tasks_mark_done", {"id": "research"})
        assert r.structured_content == {"id": "research", "done": True, "changed": True}
        assert "- [x] Research the history [id:: research]" in (kiln / "TASKS.md").read_text()
        nxt = json.loads(texts(await c.call_tool("lua_tasks_next_task", {})))
        assert nxt["task"]["id"] == "ch1"
        r = await c.call_tool("lua_tasks_mark_done", {"id": "nope"})
        assert r.is_error and texts(r) == "plugin 'tasks' failed in tasks.lua line 65: no task with id 'nope' in TASKS.md"
        for task in ("ch1", "line-6"):
            await c.call_tool("lua_tasks_mark_done", {"id": task})
        nxt = json.loads(texts(await c.call_tool("lua_tasks_next_task", {})))
        assert nxt["task"]["id"] == "print"
        await c.call_tool("lua_tasks_mark_done", {"id": "print"})
        done = json.loads(texts(await c.call_tool("lua_tasks_next_task", {})))
        assert done == {"waiting": [], "message": "every task is done"}
    assert (kiln / "TASKS.md").read_text().count("[x]") == 5
    assert (kiln / "TASKS.md").read_text().splitlines()[0] == "# Tasks"


async def test_tasks_without_a_task_file_says_how_to_start(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    async with Client(bridge_for(kiln, host_for(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_tasks_next_task", {})
        assert r.is_error and "TASKS.md does not exist yet: create it with lines like '- [ ] Task [id:: t1]'" \
            in texts(r)


async def test_the_readme_example_works_as_pasted(tmp_path: Path, env: dict[str, str], kiln: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Lua plugin tools"):]
    example = section.split("```lua\n", 1)[1].split("```", 1)[0]
    assert len(example.splitlines()) <= 15
    (tmp_path / "xdg" / "crucible" / "plugins" / "wordcount.lua").write_text(example)
    note = "Cooking/Sourdough starter.md"
    async with Client(bridge_for(kiln, host_for(tmp_path, env)).server, mode="legacy") as c:
        r = await c.call_tool("lua_wordcount_count", {"path": note})
        assert not r.is_error, texts(r)
        assert r.structured_content == {"path": note, "words": len((kiln / note).read_text().split())}
