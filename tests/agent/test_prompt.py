"""Tests of the system prompt assembly and rendering (docs/session-semantics.md rule Y)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.agent.prompt import (
    RUNTIME_CONTEXT_CLEARED,
    RUNTIME_CONTEXT_FRAMING,
    UNLISTED_TOOLS,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    Assembly,
    ContextSection,
    PromptError,
    RenderedContextSection,
    Section,
    SystemPrompt,
    ToolSpec,
    code_unit_key,
    join_context_sections,
    render_contexts,
    render_prompt,
)


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": f"{name} tool", "parameters": {"type": "object"}, **extra}


def names(items: Any) -> list[str]:
    return [i["name"] if isinstance(i, dict) else i.name for i in items]


def one_section(text: str, **variables: Any) -> Assembly:
    return Assembly(
        sections=(AssembledSection("s", 0, text),),
        variables=variables,
    )


# ------------------------------------------------------------------- Y-1


def test_Y1_variable_name_must_match_pattern() -> None:
    prompt = SystemPrompt()
    for bad in ["Foo", "1x", "", "a-b", "_a", "a b", "x\n", "é"]:
        with pytest.raises(ValueError):
            prompt.set_variable(bad, "v")
    for good in ["a", "a1", "a_b", "snake_case_9"]:
        prompt.set_variable(good, "v")


def test_Y1_variable_name_error_is_prompt_error_with_rule() -> None:
    with pytest.raises(PromptError) as err:
        SystemPrompt().scope("s").set_variable("Bad", 1)
    assert err.value.rule == "Y-1"
    assert err.value.variable == "Bad"


def test_Y1_variable_value_types() -> None:
    prompt = SystemPrompt()
    with pytest.raises(TypeError):
        prompt.set_variable("x", ["list"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        prompt.set_variable("x", float("nan"))
    prompt.set_variable("x", None)  # explicit unset is allowed; referencing it is not


def test_Y1_scopes_form_a_tree() -> None:
    prompt = SystemPrompt()
    preset = prompt.scope("preset")
    sub = prompt.scope("sub", parent="preset")
    assert prompt.scope("sub", parent="preset") is sub
    assert prompt.scope("preset") is preset
    assert prompt.get_scope("sub") is sub
    with pytest.raises(PromptError):
        prompt.get_scope("missing")
    assert prompt.scope_chain("sub") == ("preset", "sub")
    assert prompt.scope_chain(None) == ()
    with pytest.raises(ValueError):
        prompt.scope("sub")  # different parent
    with pytest.raises(ValueError):
        prompt.scope("orphan", parent="missing")


def test_Y1_unknown_scope_is_an_error() -> None:
    with pytest.raises(PromptError) as err:
        SystemPrompt().assemble("nope")
    assert err.value.rule == "Y-1"


def test_Y1_same_layer_duplicate_section_is_refused() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, "x"))
    with pytest.raises(ValueError):
        prompt.add_section(Section("a", 1, "y"))
    prompt.add_context(ContextSection("c", 0, "x"))
    with pytest.raises(ValueError):
        prompt.add_context(ContextSection("c", 1, "y"))


def test_Y1_registration_remove_unregisters() -> None:
    prompt = SystemPrompt()
    handles = [
        prompt.add_section(Section("a", 0, "A")),
        prompt.add_context(ContextSection("c", 0, "C")),
        prompt.set_variable("v", "V"),
        prompt.add_tools(lambda: [tool("t")]),
        prompt.set_tool_order(["t", UNLISTED_TOOLS]),
        prompt.add_assemble_hook(lambda a: dataclasses.replace(a, sections=())),
    ]
    scope = prompt.scope("s")
    handles.append(scope.suppress_runtime_context())
    for h in handles:
        h.remove()
        h.remove()  # idempotent
        assert not h.active
    assembly = prompt.assemble("s")
    assert assembly == Assembly()


def test_Y1_remove_does_not_remove_a_newer_value() -> None:
    prompt = SystemPrompt()
    old = prompt.set_variable("v", "old")
    prompt.set_variable("v", "new")
    old.remove()
    assert prompt.assemble().variables["v"] == "new"


def test_Y1_section_validation() -> None:
    with pytest.raises(ValueError):
        Section("", 0, "x")
    with pytest.raises(ValueError):
        Section("a", float("nan"), "x")
    with pytest.raises(TypeError):
        Section("a", 0, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ContextSection("a", "1", "x")  # type: ignore[arg-type]


# ------------------------------------------------------------------- Y-2


def test_Y2_scoped_section_shadows_global() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("identity", 0, "global"))
    prompt.scope("preset").add_section(Section("identity", 5, "preset"))
    prompt.scope("sub", "preset").add_section(Section("identity", 7, "sub"))
    assert [s.text for s in prompt.assemble().sections] == ["global"]
    assert [(s.text, s.order) for s in prompt.assemble("preset").sections] == [("preset", 5)]
    assert [s.text for s in prompt.assemble("sub").sections] == ["sub"]


def test_Y2_scoped_context_shadows_global() -> None:
    prompt = SystemPrompt()
    prompt.add_context(ContextSection("cwd", 0, "/global"))
    prompt.scope("s").add_context(ContextSection("cwd", 0, "/scoped"))
    assert [c.text for c in prompt.assemble("s").contexts] == ["/scoped"]


def test_Y2_sibling_scope_does_not_leak() -> None:
    prompt = SystemPrompt()
    prompt.scope("a").add_section(Section("x", 0, "from a"))
    prompt.scope("b").set_variable("v", "from b")
    prompt.scope("b").add_tools(lambda: [tool("b_tool")])
    assembly = prompt.assemble("a")
    assert [s.text for s in assembly.sections] == ["from a"]
    assert "v" not in assembly.variables
    assert assembly.tools == ()


def test_Y2_variables_nearest_wins() -> None:
    prompt = SystemPrompt()
    prompt.set_variable("who", "global")
    prompt.set_variable("only_global", "g")
    prompt.scope("preset").set_variable("who", "preset")
    prompt.scope("preset").set_variable("mid", "preset")
    prompt.scope("sub", "preset").set_variable("who", "sub")
    variables = prompt.assemble("sub").variables
    assert dict(variables) == {"who": "sub", "only_global": "g", "mid": "preset"}
    assert prompt.assemble("preset").variables["who"] == "preset"


def test_Y2_suppressor_on_global_ancestor_or_self() -> None:
    for where in [None, "preset", "sub"]:
        prompt = SystemPrompt()
        prompt.scope("preset")
        prompt.scope("sub", "preset")
        prompt.add_context(ContextSection("c", 0, "ctx"))
        (prompt if where is None else prompt.get_scope(where)).suppress_runtime_context()
        assert prompt.assemble("sub").contexts == ()
    # a suppressor below the assembled scope does not apply
    prompt = SystemPrompt()
    prompt.scope("preset")
    prompt.scope("sub", "preset").suppress_runtime_context()
    prompt.add_context(ContextSection("c", 0, "ctx"))
    assert [c.text for c in prompt.assemble("preset").contexts] == ["ctx"]


def test_Y2_sections_sorted_by_order_then_code_unit_name() -> None:
    prompt = SystemPrompt()
    astral = "\U0001f600"  # surrogate pair D83D DE00 in UTF-16
    bmp_high = "\uff21"  # FULLWIDTH A, code unit FF21
    prompt.add_section(Section(bmp_high, 1, "bmp"))
    prompt.add_section(Section(astral, 1, "astral"))
    prompt.add_section(Section("z", 0, "first"))
    prompt.add_section(Section("b", 2, "last"))
    # Python code-point order would put the astral name after FF21; code units put it before.
    assert sorted([bmp_high, astral]) == [bmp_high, astral]
    assert [s.text for s in prompt.assemble().sections] == ["first", "astral", "bmp", "last"]


def test_Y2_code_unit_key_matches_utf16_order() -> None:
    assert code_unit_key("\U0001f600") < code_unit_key("\uffff")
    assert code_unit_key("a") < code_unit_key("ab") < code_unit_key("b")
    assert code_unit_key("\ud800") < code_unit_key("\ue000")  # lone surrogate tolerated


def test_Y2_contexts_sorted_by_order_equal_orders_keep_registration_order() -> None:
    """Issue 17 item 1: the runtime sorts contexts by order only (a stable sort), so equal
    orders keep registration order; we used to break the tie by name (this test then
    expected one-a before one-z)."""
    prompt = SystemPrompt()
    prompt.add_context(ContextSection("b", 2, "two"))
    prompt.add_context(ContextSection("z", 1, "one-z"))
    prompt.add_context(ContextSection("a", 1, "one-a"))
    assert [c.text for c in prompt.assemble().contexts] == ["one-z", "one-a", "two"]
    # a scoped context shadowing a global one takes the global one's place
    prompt.scope("s").add_context(ContextSection("z", 1, "scoped-z"))
    assert [c.text for c in prompt.assemble("s").contexts] == ["scoped-z", "one-a", "two"]


def test_Y2_tools_merged_from_chain_and_sorted_by_name() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("read"), tool("write")])
    prompt.scope("preset").add_tools(lambda: [tool("bash")])
    prompt.scope("sub", "preset").add_tools(lambda: [ToolSpec("agent", "spawn", {})])
    assert names(prompt.assemble("sub").tools) == ["agent", "bash", "read", "write"]
    assert names(prompt.assemble("preset").tools) == ["bash", "read", "write"]
    assert names(prompt.assemble().tools) == ["read", "write"]


def test_Y2_tools_projected_to_four_keys_with_deep_copied_parameters() -> None:
    params: dict[str, Any] = {"type": "object", "properties": {"p": {"enum": ["a", "b"]}}}
    live = {
        "name": "t",
        "description": "d",
        "parameters": params,
        "deferLoading": True,
        "execute": lambda: None,
        "cache": object(),
    }
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [live, ToolSpec("u", "du", {"x": (1, 2)})])
    first = prompt.assemble().tools
    assert first[0] == {"name": "t", "description": "d", "parameters": params, "deferLoading": True}
    assert list(first[0]) == ["name", "description", "parameters", "deferLoading"]
    assert first[1] == {"name": "u", "description": "du", "parameters": {"x": [1, 2]}}
    assert "deferLoading" not in first[1]
    params["properties"]["p"]["enum"].append("c")
    assert first[0]["parameters"]["properties"]["p"]["enum"] == ["a", "b"]
    assert first[0]["parameters"] is not params
    # every assemble hands out fresh copies
    second = prompt.assemble().tools
    second[0]["parameters"]["mutated"] = True
    assert "mutated" not in prompt.assemble().tools[0]["parameters"]


def test_Y2_tool_shape_errors() -> None:
    bad_tools: list[Any] = [
        {"description": "d", "parameters": {}},
        {"name": "", "description": "d", "parameters": {}},
        {"name": "t", "parameters": {}},
        {"name": "t", "description": "d"},
        {"name": "t", "description": "d", "parameters": {}, "deferLoading": "yes"},
        {"name": "t", "description": "d", "parameters": {"x": {1, 2}}},
        {"name": "t", "description": "d", "parameters": {"x": float("inf")}},
    ]
    for bad in bad_tools:
        prompt = SystemPrompt()
        prompt.add_tools(lambda bad=bad: [bad])  # type: ignore[misc]
        with pytest.raises(PromptError) as err:
            prompt.assemble()
        assert err.value.rule == "Y-2"
    prompt = SystemPrompt()
    prompt.add_tools(lambda: ["not a tool"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        prompt.assemble()


def test_Y2_same_tool_from_two_providers_keeps_both() -> None:
    """Issue 36 item 3: the runtime keeps both schemas, global provider first."""
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("bash")])
    prompt.scope("s").add_tools(lambda: [tool("bash")])
    assert [t["name"] for t in prompt.assemble().tools] == ["bash"]
    assert [t["name"] for t in prompt.assemble("s").tools] == ["bash", "bash"]


def test_Y2_dynamic_texts_evaluated_once_with_context() -> None:
    calls: list[AssembleContext] = []

    def dyn(ctx: AssembleContext) -> str:
        calls.append(ctx)
        return f"cwd={ctx.variables['cwd']} scope={ctx.scope}"

    prompt = SystemPrompt()
    prompt.set_variable("cwd", "/g")
    prompt.scope("p").set_variable("cwd", "/p")
    prompt.scope("s", "p")
    prompt.add_section(Section("dyn", 0, dyn))
    prompt.add_context(ContextSection("dynctx", 0, lambda ctx: "ctx:" + ",".join(ctx.scope_chain)))
    assembly = prompt.assemble("s")
    assert len(calls) == 1
    assert calls[0].scope_chain == ("p", "s")
    assert assembly.sections[0].text == "cwd=/p scope=s"
    assert assembly.contexts[0].text == "ctx:p,s"
    render_prompt(assembly)
    render_contexts(assembly)
    assert len(calls) == 1  # rendering does not re-evaluate


def test_Y2_shadowed_dynamic_text_is_not_evaluated() -> None:
    def boom(ctx: AssembleContext) -> str:
        raise AssertionError("shadowed section evaluated")

    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, boom))
    prompt.scope("s").add_section(Section("a", 0, "scoped"))
    assert prompt.assemble("s").sections[0].text == "scoped"


def test_Y2_dynamic_text_must_return_str() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, lambda ctx: 42))  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError):
        prompt.assemble()


def test_Y2_hooks_waterfall_in_layer_order() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, "base"))
    seen: list[str] = []

    def hook(label: str) -> Any:
        def run(assembly: Assembly) -> Assembly:
            seen.append(label)
            text = assembly.sections[0].text + "+" + label
            section = dataclasses.replace(assembly.sections[0], text=text)
            return dataclasses.replace(assembly, sections=(section,))

        return run

    prompt.scope("s").add_assemble_hook(hook("scoped"))
    prompt.add_assemble_hook(hook("g1"))
    prompt.add_assemble_hook(hook("g2"))
    assert prompt.assemble("s").sections[0].text == "base+g1+g2+scoped"
    assert seen == ["g1", "g2", "scoped"]
    assert prompt.assemble().sections[0].text == "base+g1+g2"


def test_Y2_hook_can_rewrite_assembly() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, "{{x}}"))
    prompt.add_context(ContextSection("c", 0, "ctx"))
    prompt.add_assemble_hook(
        lambda a: dataclasses.replace(
            a,
            sections=(*a.sections, AssembledSection("b", 1, "added")),
            contexts=(),
            variables={**a.variables, "x": "from hook"},
        )
    )
    assembly = prompt.assemble()
    assert render_prompt(assembly) == "from hook\n\nadded"
    assert assembly.contexts == ()
    with pytest.raises(TypeError):
        assembly.variables["x"] = "mutate"  # type: ignore[index]


def test_Y2_hook_must_return_an_assembly() -> None:
    prompt = SystemPrompt()
    prompt.add_assemble_hook(lambda a: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError):
        prompt.assemble()


def test_Y2_complete_section_becomes_the_only_section() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("identity", 0, "global identity"))
    prompt.add_section(Section("tools", 1, "tool guide"))
    prompt.scope("sub").add_section(Section("whole", 5, "sub-agent prompt", complete=True))
    assert [s.name for s in prompt.assemble().sections] == ["identity", "tools"]
    assert render_prompt(prompt.assemble("sub")) == "sub-agent prompt"


def test_Y2_hook_cannot_undo_complete_section() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("identity", 0, "identity"))
    prompt.scope("sub").add_section(Section("whole", 5, "complete prompt", complete=True))
    hook_saw: list[list[str]] = []

    def sneaky(assembly: Assembly) -> Assembly:
        hook_saw.append([s.name for s in assembly.sections])
        extra = AssembledSection("extra", 9, "re-added by hook")
        rewritten = AssembledSection("whole", 5, "rewritten", complete=False)
        return dataclasses.replace(assembly, sections=(rewritten, extra))

    prompt.add_assemble_hook(sneaky)
    assembly = prompt.assemble("sub")
    # as in the runtime, hooks see every section; the complete one is restored after
    assert hook_saw == [["identity", "whole"]]
    assert [(s.name, s.text, s.complete) for s in assembly.sections] == [
        ("whole", "complete prompt", True)
    ]


def test_Y2_hook_cannot_undo_suppressor() -> None:
    prompt = SystemPrompt()
    prompt.add_context(ContextSection("c", 0, "ctx"))
    prompt.scope("quiet").suppress_runtime_context()
    hook_saw: list[int] = []

    def sneaky(assembly: Assembly) -> Assembly:
        hook_saw.append(len(assembly.contexts))
        return dataclasses.replace(assembly, contexts=(AssembledContext("c", 0, "smuggled"),))

    prompt.add_assemble_hook(sneaky)
    assert prompt.assemble("quiet").contexts == ()
    assert hook_saw == [0]
    assert [c.text for c in prompt.assemble().contexts] == ["smuggled"]


def test_Y2_suppressed_contexts_are_not_evaluated() -> None:
    def boom(ctx: AssembleContext) -> str:
        raise AssertionError("suppressed context evaluated")

    prompt = SystemPrompt()
    prompt.add_context(ContextSection("c", 0, boom))
    prompt.suppress_runtime_context()
    assert prompt.assemble().contexts == ()


def test_Y2_hook_added_complete_section_is_enforced() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("a", 0, "a"))
    prompt.add_assemble_hook(
        lambda a: dataclasses.replace(
            a, sections=(*a.sections, AssembledSection("c", 1, "only", complete=True))
        )
    )
    assert render_prompt(prompt.assemble()) == "only"


def test_Y2_assembly_is_immutable() -> None:
    assembly = SystemPrompt().assemble()
    with pytest.raises(dataclasses.FrozenInstanceError):
        assembly.sections = ()  # type: ignore[misc]
    assert isinstance(assembly.sections, tuple)
    assert isinstance(assembly.tools, tuple)


# ------------------------------------------------------------------- Y-3


def test_Y3_two_active_complete_sections_is_an_error() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("one", 0, "1", complete=True))
    prompt.scope("s").add_section(Section("two", 0, "2", complete=True))
    assert render_prompt(prompt.assemble()) == "1"
    with pytest.raises(PromptError) as err:
        prompt.assemble("s")
    assert err.value.rule == "Y-3"
    assert "one" in str(err.value) and "two" in str(err.value)


def test_Y3_shadowed_complete_section_is_not_active() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("one", 0, "1", complete=True))
    prompt.add_section(Section("two", 1, "2"))
    prompt.scope("s").add_section(Section("one", 0, "scoped 1"))
    prompt.scope("s").add_section(Section("three", 2, "3", complete=True))
    assert render_prompt(prompt.assemble("s")) == "3"


def test_Y3_hook_producing_two_complete_sections_is_an_error() -> None:
    prompt = SystemPrompt()
    prompt.add_assemble_hook(
        lambda a: dataclasses.replace(
            a,
            sections=(
                AssembledSection("x", 0, "x", complete=True),
                AssembledSection("y", 0, "y", complete=True),
            ),
        )
    )
    with pytest.raises(PromptError) as err:
        prompt.assemble()
    assert err.value.rule == "Y-3"


def test_Y3_tool_order_needs_marker_once() -> None:
    for order in [["b", "a"], ["a", UNLISTED_TOOLS, UNLISTED_TOOLS], []]:
        prompt = SystemPrompt()
        prompt.add_tools(lambda: [tool("a"), tool("b")])
        prompt.set_tool_order(order)
        with pytest.raises(PromptError) as err:
            prompt.assemble()
        assert err.value.rule == "Y-3"


def test_Y3_tool_order_refuses_duplicates() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("a"), tool("b")])
    prompt.set_tool_order(["a", "a", UNLISTED_TOOLS])
    with pytest.raises(PromptError) as err:
        prompt.assemble()
    assert err.value.rule == "Y-3"


def test_Y3_tool_order_unknown_name_checked_at_assemble() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("a")])
    prompt.set_tool_order(["later", UNLISTED_TOOLS])  # accepted at registration
    with pytest.raises(PromptError) as err:
        prompt.assemble()
    assert err.value.rule == "Y-3"
    assert "later" in str(err.value)
    prompt.scope("s").add_tools(lambda: [tool("later")])
    assert names(prompt.assemble("s").tools) == ["later", "a"]


def test_Y3_marker_expands_to_unlisted_tools_sorted() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("d"), tool("c"), tool("b"), tool("a"), tool("z")])
    prompt.set_tool_order(["z", UNLISTED_TOOLS, "a"])
    assert names(prompt.assemble().tools) == ["z", "b", "c", "d", "a"]


def test_Y3_nearest_tool_order_wins() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool("a"), tool("b"), tool("c")])
    prompt.set_tool_order(["c", UNLISTED_TOOLS])
    prompt.scope("s").set_tool_order([UNLISTED_TOOLS, "a"])
    assert names(prompt.assemble().tools) == ["c", "a", "b"]
    assert names(prompt.assemble("s").tools) == ["b", "c", "a"]


def test_Y3_tool_named_marker_is_refused() -> None:
    prompt = SystemPrompt()
    prompt.add_tools(lambda: [tool(UNLISTED_TOOLS)])
    with pytest.raises(PromptError) as err:
        prompt.assemble()
    assert err.value.rule == "Y-3"


def test_Y3_tool_order_must_be_names() -> None:
    with pytest.raises(TypeError):
        SystemPrompt().set_tool_order("a")


# ------------------------------------------------------------------- Y-4


def test_Y4_interpolates_and_joins_with_blank_line() -> None:
    prompt = SystemPrompt()
    prompt.set_variable("name", "Ada")
    prompt.set_variable("n", 3)
    prompt.set_variable("flag", True)
    prompt.set_variable("ratio", 0.5)
    prompt.add_section(Section("a", 0, "Hello {{name}}!"))
    prompt.add_section(Section("b", 1, "n={{n}} flag={{flag}} ratio={{ratio}}{{name}}"))
    assert render_prompt(prompt.assemble()) == "Hello Ada!\n\nn=3 flag=true ratio=0.5Ada"


def test_Y4_unknown_variable_is_an_error() -> None:
    with pytest.raises(PromptError) as err:
        render_prompt(one_section("cwd: {{cwd}}"))
    assert err.value.rule == "Y-4"
    assert err.value.variable == "cwd"
    assert err.value.section == "s"
    assert "'cwd'" in str(err.value) and "'s'" in str(err.value)


def test_Y4_none_value_is_an_error() -> None:
    prompt = SystemPrompt()
    prompt.set_variable("cwd", "/g")
    prompt.scope("s").set_variable("cwd", None)
    prompt.add_section(Section("env", 0, "cwd: {{cwd}}"))
    assert render_prompt(prompt.assemble()) == "cwd: /g"
    with pytest.raises(PromptError) as err:
        render_prompt(prompt.assemble("s"))
    assert err.value.rule == "Y-4"
    assert err.value.variable == "cwd"
    assert err.value.section == "env"


@pytest.mark.parametrize(
    "text",
    [
        "{{}}",
        "a {{ Foo }} b",
        "{{Foo}}",
        "{{1x}}",
        "{{ name }}",
        "{{a-b}}",
        "{{{name}}}",
        "prose {{ then later }} closes",
        "{{ a {{name}}",
        "{{name}} ok then {{bad name}}",
    ],
)
def test_Y4_malformed_reference_is_an_error(text: str) -> None:
    with pytest.raises(PromptError) as err:
        render_prompt(one_section(text, name="v", a="v", foo="v"))
    assert err.value.rule == "Y-4"
    assert err.value.section == "s"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a lone {{ brace", "a lone {{ brace"),
        ("{{", "{{"),
        ("}} then {{", "}} then {{"),
        ("{{name}} then {{ lone", "v then {{ lone"),
        ("x }} {{name}} {", "x }} v {"),
        ("{{name}}}", "v}"),
    ],
)
def test_Y4_lone_open_without_close_is_literal(text: str, expected: str) -> None:
    assert render_prompt(one_section(text, name="v")) == expected


def test_Y4_unrenderable_value_from_hook_is_an_error() -> None:
    for value in [[1], {"a": 1}, float("nan"), object()]:
        with pytest.raises(PromptError) as err:
            render_prompt(one_section("{{x}}", x=value))
        assert err.value.rule == "Y-4"


def test_Y4_interpolate_false_keeps_literal_text() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("doc", 0, "Write {{unknown}} and {{}}", interpolate=False))
    assert render_prompt(prompt.assemble()) == "Write {{unknown}} and {{}}"


def test_Y4_empty_sections_dropped_after_rendering() -> None:
    prompt = SystemPrompt()
    prompt.set_variable("empty", "")
    prompt.add_section(Section("a", 0, "A"))
    prompt.add_section(Section("b", 1, ""))
    prompt.add_section(Section("c", 2, "{{empty}}"))
    prompt.add_section(Section("d", 3, "  "))
    prompt.add_section(Section("e", 4, lambda ctx: ""))
    prompt.add_section(Section("f", 5, "F"))
    assert render_prompt(prompt.assemble()) == "A\n\n  \n\nF"
    assert render_prompt(Assembly()) == ""


def test_Y4_substituted_values_are_not_rescanned() -> None:
    assembly = one_section("{{a}}|{{b}}", a="{{b}}", b="{{unknown}} {{")
    assert render_prompt(assembly) == "{{b}}|{{unknown}} {{"


def test_Y4_unknown_variable_never_becomes_empty() -> None:
    prompt = SystemPrompt()
    prompt.add_section(Section("identity", 0, "You are {{agent_name}}."))
    prompt.scope("s").set_variable("agent_name", "helper")
    assert render_prompt(prompt.assemble("s")) == "You are helper."
    with pytest.raises(PromptError):
        render_prompt(prompt.assemble())


_PLAIN = st.text().filter(lambda s: "{{" not in s)


@given(_PLAIN)
def test_Y4_property_text_without_open_braces_is_unchanged(text: str) -> None:
    assert render_prompt(one_section(text, x="X")) == text


@given(st.lists(st.text(), min_size=1, max_size=4), _PLAIN, _PLAIN)
def test_Y4_property_values_come_out_literally(values: list[str], pre: str, post: str) -> None:
    # values may themselves contain references; they must appear verbatim.
    values = [v + "{{x}}" for v in values]
    variables = {f"v{i}": v for i, v in enumerate(values)}
    refs = "".join(f"{{{{v{i}}}}}" for i in range(len(values)))
    # "|" separates pre/post from the references so no brace pair straddles a boundary
    text = pre + "|" + refs + "|" + post
    expected = pre + "|" + "".join(values) + "|" + post
    assert render_prompt(one_section(text, **variables)) == expected


# ------------------------------------------------------------------- Y-5


def test_Y5_contexts_render_named_sections_under_framing() -> None:
    prompt = SystemPrompt()
    prompt.set_variable("cwd", "/repo")
    prompt.add_context(ContextSection("cwd", 0, "Working directory: {{cwd}}"))
    prompt.add_context(ContextSection("empty", 1, ""))
    prompt.add_context(ContextSection("time", 2, "Time: noon"))
    prompt.add_section(Section("sys", 0, "system"))
    assembly = prompt.assemble()
    rendered = render_contexts(assembly)
    assert rendered.sections == (
        RenderedContextSection("cwd", "Working directory: /repo"),
        RenderedContextSection("time", "Time: noon"),
    )
    assert rendered.text == (
        "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
        "\n\nWorking directory: /repo\n\nTime: noon"
    )
    assert join_context_sections(rendered.sections) == rendered.text
    # contexts are user-role input, never part of the system prompt
    assert render_prompt(assembly) == "system"


def test_Y5_contexts_are_strict_too() -> None:
    prompt = SystemPrompt()
    prompt.add_context(ContextSection("c", 0, "{{missing}}"))
    with pytest.raises(PromptError) as err:
        render_contexts(prompt.assemble())
    assert err.value.rule == "Y-4"
    assert err.value.section == "c"


def test_Y5_no_sections_join_to_empty_and_constants() -> None:
    assert render_contexts(Assembly()).sections == ()
    assert render_contexts(Assembly()).text == ""
    assert join_context_sections([]) == ""
    assert RUNTIME_CONTEXT_FRAMING == (
        "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
    )
    assert RUNTIME_CONTEXT_CLEARED == (
        "Current runtime context: none. Earlier runtime-context snapshots no longer apply."
    )
