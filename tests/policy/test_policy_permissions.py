from crucible.permissions import (
    PermissionPolicy,
    ToolKey,
    bridge_tool_name,
    normalize_rule,
    tool_key_from_acp,
)


def key(name: str, *, bridge: bool = True, read_only: bool = False) -> ToolKey:
    return ToolKey(name=name, bridge=bridge, read_only=read_only)


def test_each_agents_bridge_tool_naming_is_recognised() -> None:
    assert bridge_tool_name("mcp__crucible__create_note") == "create_note"  # claude
    assert bridge_tool_name("mcp_crucible_semantic_search__1764681") == "semantic_search"  # gemini id
    assert bridge_tool_name("crucible_delete_note") == "delete_note"  # opencode
    assert bridge_tool_name("mcp__other__create_note") is None
    assert bridge_tool_name("Bash") is None


def test_acp_request_maps_to_bridge_tool_or_kind() -> None:
    k = tool_key_from_acp({"toolCallId": "mcp_crucible_read_note__9", "title": "read_note (crucible MCP)"})
    assert (k.name, k.bridge, k.read_only) == ("read_note", True, True)
    k = tool_key_from_acp({"title": "`rm -rf build`", "kind": "execute", "rawInput": {"command": "rm -rf build"}})
    assert (k.name, k.bridge, k.read_only, k.summary) == ("execute", False, False, "rm -rf build")
    k = tool_key_from_acp({"title": "Read file", "kind": "read"})
    assert k.read_only and not k.bridge


def test_precedence_card_then_config_then_remembered_then_default() -> None:
    p = PermissionPolicy(card_rules={"delete_*": "deny"}, config_rules={"delete_note": "allow",
                         "update_note": "allow"}, card_name="librarian")
    d = p.decide(key("delete_note"))
    assert d.rule == "deny" and "card librarian: delete_* = deny" in d.reason
    d = p.decide(key("update_note"))
    assert d.rule == "allow" and "config" in d.reason
    assert p.decide(key("create_note")).rule == "ask"
    p.remember("create_note", "allow")
    d = p.decide(key("create_note"))
    assert d.rule == "allow" and "remembered" in d.reason
    d = p.decide(key("read_note", read_only=True))
    assert d.rule == "allow" and d.reason.startswith("default")


def test_exact_rule_beats_glob_and_longer_glob_beats_shorter() -> None:
    p = PermissionPolicy(card_rules={"*_note": "deny", "read_note": "allow", "*": "ask", "update_*": "allow"})
    assert p.decide(key("read_note")).rule == "allow"
    assert p.decide(key("create_note")).rule == "deny"
    assert p.decide(key("update_note")).rule == "allow"  # "update_*" (8) is longer than "*_note" (6)
    assert p.decide(key("get_kiln_info", read_only=True)).rule == "ask"


def test_child_never_widens_parent_deny() -> None:
    parent = PermissionPolicy(card_rules={"delete_note": "deny", "execute": "ask"}, label="claude")
    child = parent.child({"delete_note": "allow", "execute": "allow", "create_note": "allow"}, "reviewer")
    d = child.decide(key("delete_note"))
    assert d.rule == "deny" and "parent" in d.reason
    assert child.decide(key("execute", bridge=False)).rule == "ask"
    # Parent's default for a mutating tool is ask: the child's allow cannot lift it.
    assert child.decide(key("create_note")).rule == "ask"
    assert child.label == "claude › reviewer"
    assert child.hidden("delete_note") and not parent.hidden("read_note")


def test_rules_accept_booleans() -> None:
    assert normalize_rule(True) == "allow" and normalize_rule(False) == "deny"
    assert normalize_rule("ask") == "ask"


def test_rules_list_every_source_and_forget_drops_an_always_answer() -> None:
    parent = PermissionPolicy(config_rules={"delete_*": "deny"})
    parent.remember("create_note", "allow")
    child = parent.child({"update_note": "ask"}, "reviewer")
    child.remember("update_note", "allow")
    assert child.rules() == [("card reviewer", "update_note", "ask"), ("config [permissions]", "delete_*", "deny"),
                             ("remembered this session", "update_note", "allow"),
                             ("parent: config [permissions]", "delete_*", "deny"),
                             ("parent: remembered this session", "create_note", "allow")]
    assert parent.forget("create_note") == ["the remembered answer create_note = allow"]
    assert parent.decide(ToolKey("create_note", bridge=True, read_only=False)).rule == "ask"
    assert parent.forget("delete_*") == ["the config rule delete_* = deny"]
    assert parent.decide(ToolKey("delete_note", bridge=True, read_only=False)).rule == "ask"
    assert parent.forget("nothing") == []
