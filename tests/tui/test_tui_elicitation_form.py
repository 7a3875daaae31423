"""What the person types in answer to an upstream server's form (`parse_answer`), checked the
way the MCP spec types each field, and a hostile schema that cannot break the dialog."""

from __future__ import annotations

from typing import Any

import pytest

from crucible.sessions import ElicitationAsk
from crucible.tui.elicitation import ElicitationQueue, PendingQuestion, parse_answer


def ask(properties: Any, required: Any = None) -> ElicitationAsk:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return ElicitationAsk("agent", "up", "Tell me", schema)


FORM = ask({"name": {"type": "string"},
            "email": {"type": "string", "format": "email"},
            "when": {"type": "string", "format": "date-time"},
            "home": {"type": "string", "format": "uri"},
            "code": {"type": "string", "minLength": 2, "maxLength": 4},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "fish": {"type": "array", "items": {"anyOf": [{"const": "f1", "title": "Tuna"},
                                                          {"const": "f2", "title": "Salmon"}]}}},
           required=["name"])


@pytest.mark.parametrize(("typed", "content"), [
    ("Ada", {"name": "Ada"}),  # the one required field: its value alone
    ("NAME=Ada; Fish=salmon, TUNA, Salmon", {"name": "Ada", "fish": ["f2", "f1"]}),
    ("name=Ada; when=2026-12-31T09:30; home=https://x.org/?a=b; code=ab; ratio=0.5",
     {"name": "Ada", "when": "2026-12-31T09:30", "home": "https://x.org/?a=b", "code": "ab", "ratio": 0.5}),
])
def test_answers_become_the_values_the_spec_types(typed: str, content: dict[str, Any]) -> None:
    assert parse_answer(FORM, typed) == content


@pytest.mark.parametrize(("typed", "problem"), [
    ("", "name is needed"),
    ("name=Ada; email=ada", "email must be an email address"),
    ("name=Ada; when=tomorrow", "when must be a date and time such as 2026-12-31T09:30"),
    ("name=Ada; home=x.org", "home must be a link such as https://example.org"),
    ("name=Ada; code=abcde", "code takes at most 4 characters"),
    ("name=Ada; ratio=2", "ratio must be at most 1"),
    ("name=Ada; fish=Cod", "fish must be one of Tuna, Salmon"),
    ("name=Ada; colour=red", "no field 'colour'"),
    ("name=Ada; just words", "write name=value; name=value"),
])
def test_a_wrong_answer_says_what_is_wrong(typed: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_answer(FORM, typed)


def test_a_value_in_quotes_keeps_its_semicolons_and_a_name_may_hold_an_equals_sign() -> None:
    assert parse_answer(FORM, 'name="Ada; Lovelace"; code="a;b"') == {"name": "Ada; Lovelace", "code": "a;b"}
    # a quote that does not start the value is part of it
    assert parse_answer(FORM, 'name=5" tall; code=ab') == {"name": '5" tall', "code": "ab"}
    odd = ask({"a=b": {"type": "string"}, "A": {"type": "string"}})
    assert parse_answer(odd, "a=b=x; a = y") == {"a=b": "x", "A": "y"}


def test_one_field_takes_the_whole_text_even_with_separators() -> None:
    link = ask({"link": {"type": "string"}})
    assert parse_answer(link, "https://x.org/?a=b;c=d") == {"link": "https://x.org/?a=b;c=d"}
    assert parse_answer(link, "link=https://y.org") == {"link": "https://y.org"}


def test_a_hostile_schema_is_bounded_and_drawn_without_escapes() -> None:
    hostile = ask({"pick": {"type": "string", "enum": [f"v{i}" for i in range(100_000)]},
                   "\x1b[2Jbad": {"type": "string", "description": "\x1b]0;title\x07" + "d" * 10_000},
                   "broken": "not a field", "n" * 10_000: {"type": "string", "default": "x" * 100_000},
                   "many": {"type": "array", "default": list(range(100_000))},
                   **{f"f{i}": {"type": "string"} for i in range(50)}},
                  required=[{"not": "a name"}, "pick"])
    queue = ElicitationQueue(lambda: None)
    queue.items.append(PendingQuestion(hostile))
    lines = ["".join(text for _, text in line) for line in queue.dialog_lines()]
    assert "\x1b" not in "".join(lines) and "\x07" not in "".join(lines)
    assert len(lines) <= 13  # the title, ten fields, "… and N more", the keys
    assert "v7, … (200 or more) (required)" in lines[1] and "… and 44 more: f6, f7" in lines[-2]
    assert all(len(line) < 400 for line in lines)
    assert parse_answer(hostile, "pick=v5")["pick"] == "v5"  # (the others keep their defaults)
    with pytest.raises(ValueError, match="pick must be one of"):
        parse_answer(hostile, "pick=v150000")
