"""``workflows/arguments.py``: a tool call's arguments checked against the
tool's recorded JSON schema (coercion, the refusal the model reads, defaults,
the nesting limit). Pure functions: no server, no worker."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fake_loop import FakeAgent, calls, say, user
from workflows.arguments import MAX_NESTING, ToolArgumentsError, nesting_depth, validate_tool_arguments
from workflows.loop import run_agent_loop
from workflows.models import ToolDeclaration


def tool(**schema: Any) -> ToolDeclaration:
    return ToolDeclaration(name="t", parameters={"type": "object", **schema})


def refusal(declaration: ToolDeclaration, arguments: dict[str, Any]) -> str:
    with pytest.raises(ToolArgumentsError) as refused:
        validate_tool_arguments(declaration, arguments)
    return str(refused.value)


def nested(levels: int) -> dict[str, Any]:
    """Arguments ``levels`` deep (the arguments object is the first level)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"d": value}
    return value


def test_arguments_nested_exactly_64_deep_are_taken_65_refused() -> None:
    """README: arguments nested up to 64 levels reach the tool; one more is refused."""
    assert MAX_NESTING == 64
    assert validate_tool_arguments(tool(), nested(64)) == nested(64)
    assert refusal(tool(), nested(65)).endswith("nested deeper than 64 levels.")


def test_empty_objects_and_lists_count_as_a_level() -> None:
    """A scalar is no level; every object or list, empty or not, is one."""
    assert nesting_depth("x") == 0
    assert nesting_depth({}) == 1 and nesting_depth([]) == 1
    assert nesting_depth({"a": [[]]}) == 3


def test_nesting_is_counted_against_the_limit_the_caller_gives() -> None:
    """The start input is measured against its own, larger limit, through objects and lists."""
    assert nesting_depth(nested(72), 72) == 72
    assert nesting_depth(nested(100), 72) == 73
    deep_list: Any = 1
    for _ in range(100):
        deep_list = [deep_list]
    assert nesting_depth(deep_list, 72) == 73


def test_a_hostile_deeply_nested_value_is_measured_without_recursing_through_it() -> None:
    """Counting stops past the limit: a value thousands of levels deep is refused, never a RecursionError."""
    value: Any = "leaf"
    for _ in range(5000):
        value = {"d": value}
    assert nesting_depth(value) == MAX_NESTING + 1
    assert "nested deeper than 64 levels" in refusal(tool(), value)


def test_validation_leaves_the_arguments_it_was_given_untouched() -> None:
    """Coercion and defaults go into a copy: the model's call keeps what it sent."""
    sent = {"n": "3"}
    checked = validate_tool_arguments(
        tool(properties={"n": {"type": "number"}, "k": {"type": "integer", "default": 1}}), sent
    )
    assert checked == {"n": 3, "k": 1} and sent == {"n": "3"}


async def test_the_transcript_keeps_the_arguments_the_model_sent() -> None:
    """The assistant message in the conversation shows the call as the model made it, not as coerced."""
    seen: list[dict[str, Any]] = []

    async def record(args: dict[str, Any]) -> str:
        seen.append(args)
        return "ok"

    fake = FakeAgent(answers=[calls(("c1", "rec", {"text": 5})), say("done")])
    fake.tool("rec", record)
    context = fake.context()
    await run_agent_loop([user("go")], context, fake.config())
    assert seen == [{"text": "5", "delay": 0}]
    assert context.messages[1].content[0].arguments == {"text": 5}


def test_three_coercions_each_bringing_new_rules_into_force_are_all_made() -> None:
    """Coercing `a` brings `b`'s rule into force, and coercing `b` brings `c`'s: three rounds."""
    declaration = tool(
        properties={"a": {"type": "integer"}},
        allOf=[
            {
                "if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
                "then": {"properties": {"b": {"type": "integer"}}},
            },
            {
                "if": {"properties": {"b": {"const": 1}}, "required": ["b"]},
                "then": {"properties": {"c": {"type": "integer"}}},
            },
        ],
    )
    assert validate_tool_arguments(declaration, {"a": "1", "b": "1", "c": "1"}) == {"a": 1, "b": 1, "c": 1}


def test_every_problem_is_listed_in_the_order_of_its_place_in_the_arguments() -> None:
    """The model reads every failing argument, one line each, sorted by where it sits."""
    declaration = tool(properties={"b": {"type": "integer"}, "a": {"type": "integer"}})
    said = refusal(declaration, {"a": "x", "b": "y"})
    assert said.startswith(
        'Validation failed for tool "t":\n'
        "  - a: 'x' is not of type 'integer'\n"
        "  - b: 'y' is not of type 'integer'\n\n"
        "Received arguments:\n"
    )


def test_a_missing_argument_is_listed_before_a_wrong_one() -> None:
    """As pi lists them: what is missing from the arguments first, then what is wrong inside them."""
    declaration = tool(properties={"a": {"type": "integer"}, "z": {"type": "string"}}, required=["z"])
    said = refusal(declaration, {"a": "x"})
    assert "  - z: required property missing\n  - a: 'x' is not of type 'integer'\n" in said


def test_the_refusal_shows_the_arguments_as_the_model_sent_them() -> None:
    """Received arguments: uncoerced, indented JSON, non-ASCII text as it was written."""
    declaration = tool(properties={"n": {"type": "number"}, "s": {"type": "integer"}})
    said = refusal(declaration, {"n": "3", "s": "café"})
    assert said.endswith('Received arguments:\n{\n  "n": "3",\n  "s": "café"\n}')


def test_every_missing_required_property_is_named() -> None:
    """Two required arguments missing: the model is told which two."""
    declaration = tool(properties={"a": {"type": "string"}, "b": {"type": "string"}}, required=["a", "b"])
    said = refusal(declaration, {})
    assert "  - a: required property missing\n  - b: required property missing\n" in said


def test_a_nested_problem_is_located_by_its_dotted_path() -> None:
    """`opts.n` and `items.1` tell the model which inner value is wrong."""
    declaration = tool(
        properties={
            "opts": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "items": {"type": "array", "items": {"type": "integer"}},
        }
    )
    said = refusal(declaration, {"opts": {"n": "x"}, "items": [1, "y"]})
    assert "  - items.1: 'y' is not of type 'integer'\n  - opts.n: 'x' is not of type 'integer'\n" in said


def test_nested_scalars_are_coerced_where_they_sit() -> None:
    """Coercion reaches values inside objects and lists, not only top-level ones."""
    declaration = tool(
        properties={
            "opts": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "items": {"type": "array", "items": {"type": "number"}},
        }
    )
    checked = validate_tool_arguments(declaration, {"opts": {"n": "4"}, "items": ["1", "2.5"]})
    assert checked == {"opts": {"n": 4}, "items": [1, 2.5]}


def test_a_schema_that_is_no_object_type_refuses_the_call_at_the_root() -> None:
    """A type error on the arguments themselves is a refusal located at `root`, never a crash."""
    declaration = ToolDeclaration(name="t", parameters={"type": "string"})
    assert "  - root: {} is not of type 'string'\n" in refusal(declaration, {})


def test_a_rule_other_than_a_type_is_refused_with_the_schemas_words() -> None:
    """A length, range or pattern failure is never coerced: the model reads the schema's words."""
    declaration = tool(
        properties={"s": {"type": "string", "maxLength": 3}, "n": {"type": "integer", "minimum": 5}}
    )
    said = refusal(declaration, {"s": "abcdef", "n": 2})
    assert "  - n: 2 is less than the minimum of 5\n  - s: 'abcdef' is too long\n" in said


def test_a_property_schema_of_true_takes_anything_and_has_no_default() -> None:
    """Boolean subschemas (`"x": true`) are valid JSON Schema: no crash filling defaults."""
    declaration = tool(properties={"x": True, "y": {"default": 2}})
    assert validate_tool_arguments(declaration, {}) == {"y": 2}


def test_a_schema_without_properties_takes_the_arguments_as_they_are() -> None:
    """A tool declaring only `{"type": "object"}` receives whatever object the model sent."""
    declaration = ToolDeclaration(name="t", parameters={"type": "object"})
    assert validate_tool_arguments(declaration, {"any": "thing"}) == {"any": "thing"}


@pytest.mark.parametrize(
    ("kind", "sent", "received"),
    [
        (["null", "number"], "5", 5),
        ("integer", "-3", -3),
        ("integer", "+4", 4),
        ("boolean", "true", True),
        ("string", 2.5, "2.5"),
    ],
)
def test_more_scalars_are_coerced_to_the_type_the_schema_asks_for(
    kind: Any, sent: Any, received: Any
) -> None:
    """Signed integers, `true`, a fractional number as text, and any type of a list of types."""
    checked = validate_tool_arguments(tool(properties={"v": {"type": kind}}), {"v": sent})
    assert checked == {"v": received} and type(checked["v"]) is type(received)


@pytest.mark.parametrize(
    ("kind", "sent"),
    [
        ("number", "-inf"),
        ("integer", "3 apples"),
        ("number", None),
        ("integer", None),
    ],
)
def test_more_values_that_are_not_the_type_asked_for_are_refused(kind: str, sent: Any) -> None:
    """`-inf`, a number followed by words and `null` are refused with the schema's words, never guessed."""
    said = refusal(tool(properties={"v": {"type": kind}}), {"v": sent})
    assert f"is not of type '{kind}'" in said
