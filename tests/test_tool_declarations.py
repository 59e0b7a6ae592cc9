"""Tools are declared once for every conversation on a worker: one a model
server refuses would make every request of every conversation fail (400),
so `@tool` refuses it with a sentence, and writes out what OpenAI cannot
read (a schema whose root is a reference)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, RootModel

from activities.tools import _registry, declarations, registered_tools, tool
from testbed.scripted_model.server import tools_problem
from worker import ToolModuleError, load_tool_modules


class Node(BaseModel):
    value: int
    children: list[Node] = []


class Text(BaseModel):
    text: str


@pytest.fixture(autouse=True)
def _registry_restored() -> Any:
    before = dict(_registry)
    yield
    _registry.clear()
    _registry.update(before)


def test_a_tool_taking_a_model_that_refers_to_itself_is_sent_as_an_object() -> None:
    @tool(description="Sum a tree.")
    async def tree(args: Node) -> str:
        return "0"

    spec = registered_tools()["tree"]
    schema = spec.openai_tool()["function"]["parameters"]
    assert schema["type"] == "object" and "$ref" not in schema
    assert tools_problem([spec.openai_tool()]) is None
    Draft202012Validator(schema).validate({"value": 1, "children": [{"value": 2, "children": []}]})
    assert spec.declaration().parameters == schema  # what the workflow validates calls with


@pytest.mark.parametrize(
    ("name", "description", "model", "why"),
    [
        ("docs.search", "Search.", Text, "Tool name 'docs.search' is not one models take"),
        ("größe", "Size.", Text, "Tool name 'größe' is not one models take"),
        ("x" * 65, "Long.", Text, "is not one models take"),
        ("numbers", "Numbers.", RootModel[list[int]], "whose JSON schema is not an object"),
    ],
)
def test_a_tool_a_model_server_would_refuse_is_refused_when_declared(
    name: str, description: str, model: type[BaseModel], why: str
) -> None:
    async def function(args: Any) -> str:
        return ""

    function.__annotations__ = {"args": model, "return": str}
    with pytest.raises(ValueError) as refused:
        tool(description=description, name=name)(function)
    assert why in str(refused.value)
    assert name not in registered_tools()


@pytest.mark.parametrize(
    ("module", "source", "says"),
    [
        (
            "nosuch_tools",
            None,
            "Cannot load tool module 'nosuch_tools': No module named 'nosuch_tools'. Check",
        ),
        (
            "needs_dep_tools",
            "import notinstalled_pkg\n",
            "it imports 'notinstalled_pkg', which is not installed",
        ),
        (
            "dotted_name_tools",
            "from pydantic import BaseModel\nfrom activities.tools import tool\n"
            "class A(BaseModel):\n    q: str\n"
            "@tool(description='Search.', name='docs.search')\n"
            "async def search(args: A) -> str:\n    return ''\n",
            "ValueError: Tool name 'docs.search' is not one models take: use 1 to 64 letters, digits, "
            "`_` or `-` (name=... in @tool).",
        ),
    ],
)
def test_a_tool_module_that_does_not_load_says_why_in_one_sentence(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, module: str, source: str | None, says: str
) -> None:
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolModuleError) as failed:
        load_tool_modules([module])
    assert says in str(failed.value) and not str(failed.value).endswith("..")


def test_a_long_description_is_declared_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    @tool(description="w" * 1500)
    async def wordy(args: Text) -> str:
        return ""

    assert "wordy" in registered_tools()
    assert "description of 1500 characters: some model servers take at most 1024" in caplog.text


def test_a_second_tool_of_the_same_name_is_refused() -> None:
    @tool(description="First.", name="twice")
    async def first(args: Text) -> str:
        return "first"

    async def second(args: Text) -> str:
        return "second"

    with pytest.raises(ValueError, match=r"^A tool named 'twice' is already registered\.$"):
        tool(description="Second.", name="twice")(second)
    assert registered_tools()["twice"].function is first


def test_a_tool_that_is_not_async_is_refused() -> None:
    def blocking(args: Text) -> str:
        return ""

    with pytest.raises(TypeError, match=r"^Tool 'blocking' must be an `async def` function\.$"):
        tool(description="Blocks.")(blocking)  # type: ignore[arg-type]


def test_an_async_generator_is_refused_saying_so() -> None:
    """It is an `async def` too: "must be an `async def` function" puzzled (a robustness audit)."""

    async def streaming(args: Text) -> AsyncIterator[str]:
        yield "part"

    with pytest.raises(
        TypeError, match=r"^Tool 'streaming' must be an `async def` function that returns its result"
    ):
        tool(description="Streams.")(streaming)  # type: ignore[arg-type]


def test_a_tool_taking_more_than_its_arguments_model_is_refused() -> None:
    async def two(args: Text, extra: int) -> str:
        return ""

    with pytest.raises(TypeError, match="must take exactly one argument annotated with a pydantic model"):
        tool(description="Two.")(two)  # type: ignore[arg-type]


def test_an_unknown_execution_mode_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"^execution_mode must be None, 'sequential' or 'parallel', not 'serial'\.$"
    ):
        tool(description="Mode.", execution_mode="serial")  # type: ignore[arg-type]


def test_a_star_makes_every_tool_local_and_names_make_only_those() -> None:
    @tool(description="A.")
    async def tool_a(args: Text) -> str:
        return ""

    @tool(description="B.")
    async def tool_b(args: Text) -> str:
        return ""

    tools = {name: registered_tools()[name] for name in ("tool_b", "tool_a")}
    everything = declarations(tools, {"*"})
    only_b = declarations(tools, {"tool_b"})
    assert [(d.name, d.local) for d in everything] == [("tool_a", True), ("tool_b", True)]
    assert [(d.name, d.local) for d in only_b] == [("tool_a", False), ("tool_b", True)]
