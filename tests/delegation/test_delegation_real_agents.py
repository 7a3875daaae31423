"""A real agent delegates to a card that runs another real agent: OpenCode (the parent, through
`cru chat -p`) calls `delegate_session` on its bridge and the card `scout` runs Claude
(claude-agent-acp) as the child; then the other way round. Both talk to one fake LLM,
offline; only the LLM is fake."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from delegation_helpers import REPO, card_text, pids_running

sys.path.insert(0, str(REPO / "fixtures"))

import agent_env  # noqa: E402
import netns  # noqa: E402
from fake_llm import FakeLLM, Reply  # noqa: E402

pytestmark = [pytest.mark.real_agent]


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    reason = agent_env.ensure_npm()
    if reason is not None:
        pytest.skip(reason)
    with FakeLLM() as llm:
        yield llm


API = {"claude": "anthropic", "opencode": "openai", "gemini": "gemini"}


@pytest.mark.parametrize(("parent", "child"), [("opencode", "claude"), ("claude", "opencode")])
def test_a_real_agent_delegates_to_a_card_that_runs_another(fake_llm: FakeLLM, tmp_path: Path, fixture_kiln_src: Path,
                                                            cru_bin: str, parent: str, child: str) -> None:
    kiln = tmp_path / "kiln"
    shutil.copytree(fixture_kiln_src, kiln, ignore=shutil.ignore_patterns(".crucible"))
    (kiln / ".crucible" / "agents").mkdir(parents=True)
    (kiln / ".crucible" / "agents" / "scout.md").write_text(
        card_text("Scout: answers one question briefly", "You are the scout. Answer in one sentence.",
                  agent="kid"), encoding="utf-8")
    child_argv, child_env = agent_env.agent_launch(child, fake_llm.url, tmp_path / "home-child")
    config = tmp_path / "config.toml"
    config.write_text(
        "[agents.kid]\n"
        f"command = {json.dumps(child_argv[0])}\n"
        f"args = {json.dumps(child_argv[1:])}\n"
        f"env = {{ {', '.join(f'{json.dumps(k)} = {json.dumps(v)}' for k, v in child_env.items())} }}\n"
        "[permissions]\ndelegate_session = \"allow\"\n", encoding="utf-8")
    _, env = agent_env.agent_launch(parent, fake_llm.url, tmp_path / "home-parent")
    env["CRUCIBLE_CONFIG"] = str(config)
    work = tmp_path / "work"
    work.mkdir()

    fake_llm.push(
        Reply.tool_call("delegate_session", {"target": "scout", "prompt": "Say hello from the child."}),
        Reply.text_reply("CHILD-REPLY: hello from the scout."),
        Reply.text_reply("PARENT-DONE: the scout said hello."))
    argv = [cru_bin, "chat", "-a", parent, "--kiln", str(kiln), "--cwd", str(work), "-p", "Ask the scout."]
    if netns.unavailable_reason() is None:
        argv = netns.wrap(argv, [fake_llm.port])
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "PARENT-DONE: the scout said hello." in res.stdout, "\n".join(fake_llm.tool_result_texts())
    # The child really was the other agent: its requests speak its API.
    apis = [r.api for r in fake_llm.main_requests()]
    assert apis == [API[parent], API[child], API[parent]], apis
    child_request = json.dumps(fake_llm.main_requests()[1].body)
    assert "You are the scout." in child_request and "Say hello from the child." in child_request
    assert "Ask the scout." not in child_request  # the parent's conversation stays with the parent
    # The parent's LLM got the child's reply as the tool's result.
    results = "\n".join(fake_llm.tool_result_texts())
    assert "CHILD-REPLY: hello from the scout." in results, results[:2000]
    assert f"[child {parent} › scout] CHILD-REPLY: hello from the scout." in res.stderr
    assert not pids_running(str(tmp_path / "home-child"))
