"""Rendering an assembly: the system prompt text (Y-4) and the runtime-context
sections (Y-5), with variable interpolation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from processor.agent.prompt_types import (
    NAME_RE,
    RUNTIME_CONTEXT_FRAMING,
    Assembly,
    PromptError,
    VariableValue,
)


@dataclass(frozen=True)
class RenderedContextSection:
    """One runtime-context section after interpolation (kept for attribution, R-2)."""

    name: str
    text: str


@dataclass(frozen=True)
class RenderedContext:
    """The runtime context rendered once (Y-5): named sections, empty ones dropped."""

    sections: tuple[RenderedContextSection, ...]

    @property
    def text(self) -> str:
        """The framed snapshot text (``""`` when there are no sections)."""
        return join_context_sections(self.sections)


def _format_value(value: object, section: str, name: str) -> str:
    if value is None:
        raise PromptError(
            "Y-4", f"section {section!r}: variable {name!r} is None", section=section, variable=name
        )
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(value)
    raise PromptError(
        "Y-4",
        f"section {section!r}: variable {name!r} has an unrenderable value {value!r}",
        section=section,
        variable=name,
    )


def interpolate(text: str, variables: Mapping[str, VariableValue], section: str) -> str:
    """Replace ``{{name}}`` strictly (Y-4).

    Scan for ``{{``; with no ``}}`` anywhere after it the rest is literal prose
    (e.g. code samples); otherwise the text between must be a valid name, which
    must be set and not ``None``.  Values are inserted as is and never
    rescanned, so a value containing ``{{x}}`` cannot inject a reference.
    """
    out: list[str] = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            break
        end = text.find("}}", start + 2)
        if end < 0:
            break  # lone "{{": literal
        out.append(text[pos:start])
        ref = text[start + 2 : end]
        if not NAME_RE.fullmatch(ref):
            raise PromptError(
                "Y-4",
                f"section {section!r}: malformed reference {text[start : end + 2]!r}",
                section=section,
                variable=ref or None,
            )
        if ref not in variables:
            raise PromptError(
                "Y-4",
                f"section {section!r}: unknown variable {ref!r}",
                section=section,
                variable=ref,
            )
        out.append(_format_value(variables[ref], section, ref))
        pos = end + 2
    out.append(text[pos:])
    return "".join(out)


def render_prompt(assembly: Assembly) -> str:
    """The system prompt text (Y-4): sections interpolated, ``""`` dropped, blank-line joined."""
    parts: list[str] = []
    for section in assembly.sections:
        text = (
            interpolate(section.text, assembly.variables, section.name)
            if section.interpolate
            else section.text
        )
        if text != "":
            parts.append(text)
    return "\n\n".join(parts)


def render_contexts(assembly: Assembly) -> RenderedContext:
    """Render runtime contexts once (Y-5): interpolated, named, empty ones dropped."""
    rendered: list[RenderedContextSection] = []
    for context in assembly.contexts:
        text = interpolate(context.text, assembly.variables, context.name)
        if text != "":
            rendered.append(RenderedContextSection(name=context.name, text=text))
    return RenderedContext(sections=tuple(rendered))


def join_context_sections(sections: Iterable[RenderedContextSection]) -> str:
    """Join sections under the framing line (Y-5); ``""`` when there are none.

    The framing tells the model this snapshot replaces earlier ones, since
    snapshots accumulate in the transcript as user-role messages.
    """
    texts = [s.text for s in sections]
    if not texts:
        return ""
    return RUNTIME_CONTEXT_FRAMING + "\n\n" + "\n\n".join(texts)
