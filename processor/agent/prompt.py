"""System prompt assembly and rendering (docs/session-semantics.md section 7, rule Y).

This module is pure: no I/O, no clock, no Kafka.  It turns registered
contributions into an immutable :class:`Assembly` and renders that into the
system prompt text (:func:`render_prompt`, Y-4) and the runtime-context
sections (:func:`render_contexts` / :func:`join_context_sections`, Y-5), which
go to the model as user-role input, never in the system prompt.

Here: registration and assembly.  The values it produces are in
``prompt_types``, rendering in ``prompt_render``, merging and ordering the
tools in ``prompt_tools``; every public name is re-exported from here.

Layers (Y-1)
------------
:class:`SystemPrompt` owns one *global* layer and any number of *scoped*
layers.  ``prompt.scope(name, parent)`` declares a scope; scopes form a tree
(agent preset -> sub-agent -> ...).  ``prompt`` itself and every :class:`Scope`
expose the same registration methods:

``add_section(Section)``, ``add_context(ContextSection)``,
``set_variable(name, value)``, ``add_tools(provider)``,
``suppress_runtime_context()``, ``set_tool_order(names)``,
``add_assemble_hook(hook)``.

Each returns a :class:`Registration` whose ``remove()`` unregisters exactly
that contribution (idempotent; a no-op once the contribution was replaced), so
a plugin can undo what it added without knowing what others added.

Assembly (Y-2, Y-3)
-------------------
``prompt.assemble(scope)`` follows Y-2 step by step: scope chain and
suppressor; variables global first, then scopes far-to-near (nearest wins);
sections and contexts merged by name (nearest layer wins); tools collected
from the global layer and every scope of the chain (merged, never shadowed);
sections sorted by ``(order, name by UTF-16 code unit)``, contexts by
``order`` only (equal orders keep merge order: global registrations first in
registration order, a scoped context that shadows one takes its place), tools
by name (code unit) unless a tool order is set; dynamic texts evaluated once;
hooks run as a waterfall; finally the complete-section and suppressor policies
are restored so a hook cannot undo them.

Rendering (Y-4, Y-5)
--------------------
``{{name}}`` references are strict: unknown names, ``None`` values and
malformed references are errors (:class:`PromptError`), never silently empty,
because a silently blank identity or directory line is worse than a failure.

Decisions where the semantics and the runtime are silent
----------------------------------------------------------
* Unknown scope passed to ``assemble`` -> ``PromptError`` (rule ``Y-1``); a
  typo must not silently assemble the global layer only.  A scope's parent must
  already be declared (so the tree has no cycles); redeclaring a scope with a
  different parent is a ``ValueError``.
* Two sections (or two contexts) with the same name *in the same layer* are a
  ``ValueError`` at registration: shadowing is a cross-layer concept, and a
  same-layer clash is almost always two plugins colliding.  ``set_variable``
  and ``set_tool_order`` overwrite within their layer (they are "set").
* Variable values are ``str``, ``int``, ``float``, ``bool`` or ``None``.
  Rendering: ``str`` as is, ``bool`` as ``"true"``/``"false"`` (what the
  TypeScript harness prints), ``int``/``float`` via ``str()``.  Non-finite
  floats are refused (they are not JSON).  ``None`` may be *set* (an explicit
  "unset" that shadows an outer value) but *referencing* it is a Y-4 error.
* Inside ``{{...}}`` no whitespace is allowed: ``{{ name }}`` is malformed.
* An empty section is one whose rendered text is exactly ``""``; whitespace-only
  text is kept (as the reference does).
* When a suppressor is active, contexts are not evaluated at all and hooks see
  ``contexts == ()``; when a complete section is active every section is still
  evaluated and hooks see them all (as in the runtime), then the complete
  section is restored as the only one.  Both are restored after the hooks
  (the design says "restore").  If no complete section was registered but a hook
  returns sections flagged ``complete``, the same policy is applied to the
  hook's output (one -> it becomes the only section, more -> Y-3 error), so an
  :class:`Assembly` from ``assemble`` never mixes a complete section with
  others.
* Tools providers are zero-argument callables returning an iterable of
  :class:`ToolSpec` or tool mappings (camelCase keys ``name``,
  ``description``, ``parameters``, optional ``deferLoading``; other keys are
  dropped).  ``name`` must be a non-empty str, ``description`` a str,
  ``parameters`` a JSON object; ``deferLoading`` a bool or ``None`` and kept
  only when ``True`` (the runtime drops ``false``: it means the default).
* The same tool name from two providers (or twice from one) keeps both
  tools in provider order, as the runtime's assembly does (issue 36 item 3),
  and logs a warning.  A header then declares the name twice; if the name is
  new against the previous header, the H-3 addition names it twice and D-3
  refuses the update (the runtime writes it and its own reader refuses it:
  docs/runtime-load-checks.md).
* Orders must be finite numbers (the runtime throws on a non-finite order).
* The tool order in effect is the nearest layer's (scoped shadows global).
* Assemble hooks run global first, then scopes far-to-near, each layer in
  registration order.  A hook must return an :class:`Assembly`.
* Dynamic texts receive an :class:`AssembleContext` (scope, chain, merged
  variables) and must return ``str``.  Wrong Python types returned by user
  callables raise ``TypeError``; wrong values raise :class:`PromptError`.
* :func:`join_context_sections` renders each section as its text as is (the
  names are kept in :class:`RenderedContext` for attribution) and returns
  ``""`` for no sections; the caller decides between sending nothing and
  :data:`RUNTIME_CONTEXT_CLEARED` (rule R-1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from processor.agent.prompt_render import (
    RenderedContext,
    RenderedContextSection,
    interpolate,
    join_context_sections,
    render_contexts,
    render_prompt,
)
from processor.agent.prompt_tools import (
    collect_tools,
    order_tools,
)
from processor.agent.prompt_types import (
    NAME_RE,
    RUNTIME_CONTEXT_CLEARED,
    RUNTIME_CONTEXT_FRAMING,
    UNLISTED_TOOLS,
    AssembleContext,
    AssembledContext,
    AssembledSection,
    AssembleHook,
    Assembly,
    ContextSection,
    DynamicText,
    PromptError,
    Section,
    ToolSpec,
    ToolsProvider,
    VariableValue,
    code_unit_key,
)

__all__ = [
    "RUNTIME_CONTEXT_CLEARED",
    "RUNTIME_CONTEXT_FRAMING",
    "UNLISTED_TOOLS",
    "AssembleContext",
    "AssembleHook",
    "AssembledContext",
    "AssembledSection",
    "Assembly",
    "ContextSection",
    "PromptError",
    "Registration",
    "RenderedContext",
    "RenderedContextSection",
    "Scope",
    "Section",
    "SystemPrompt",
    "ToolSpec",
    "ToolsProvider",
    "VariableValue",
    "code_unit_key",
    "interpolate",
    "join_context_sections",
    "render_contexts",
    "render_prompt",
]


class Registration:
    """Handle returned by every registration; ``remove()`` undoes exactly it.

    Removal is idempotent and only removes the contribution this handle
    registered — if it was since replaced (``set_variable`` again), the newer
    value stays.  This lets plugins clean up without coordinating.
    """

    def __init__(self, remover: Callable[[], None]) -> None:
        self._remover: Callable[[], None] | None = remover

    @property
    def active(self) -> bool:
        """False once ``remove()`` was called."""
        return self._remover is not None

    def remove(self) -> None:
        """Unregister the contribution (no-op when already removed)."""
        remover, self._remover = self._remover, None
        if remover is not None:
            remover()


class _Token:
    """Identity of one registration (so removal never hits a newer one)."""

    __slots__ = ()


class _Layer:
    """Contributions of one layer (global or one scope)."""

    def __init__(self) -> None:
        self.sections: dict[str, tuple[_Token, Section]] = {}
        self.contexts: dict[str, tuple[_Token, ContextSection]] = {}
        self.variables: dict[str, tuple[_Token, VariableValue]] = {}
        self.tools: dict[_Token, ToolsProvider] = {}
        self.suppressors: set[_Token] = set()
        self.tool_order: tuple[_Token, tuple[str, ...]] | None = None
        self.hooks: dict[_Token, AssembleHook] = {}


class _Registrar:
    """Registration methods shared by the global layer and scopes."""

    _layer: _Layer

    def add_section(self, section: Section) -> Registration:
        """Register a section; same name in a nearer layer shadows it (Y-1)."""
        if not isinstance(section, Section):
            raise TypeError(f"expected a Section, got {type(section).__name__}")
        if section.name in self._layer.sections:
            raise ValueError(f"section {section.name!r} is already registered in this layer")
        token = _Token()
        self._layer.sections[section.name] = (token, section)
        return Registration(lambda: _drop_named(self._layer.sections, section.name, token))

    def add_context(self, context: ContextSection) -> Registration:
        """Register a runtime-context section; nearer layers shadow by name (Y-1)."""
        if not isinstance(context, ContextSection):
            raise TypeError(f"expected a ContextSection, got {type(context).__name__}")
        if context.name in self._layer.contexts:
            raise ValueError(f"context {context.name!r} is already registered in this layer")
        token = _Token()
        self._layer.contexts[context.name] = (token, context)
        return Registration(lambda: _drop_named(self._layer.contexts, context.name, token))

    def set_variable(self, name: str, value: VariableValue) -> Registration:
        """Set a variable in this layer (overwrites this layer's previous value).

        The name must match ``[a-z][a-z0-9_]*`` (Y-1) so that every
        ``{{...}}`` either is a clean reference or is visibly malformed (Y-4).
        """
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise PromptError(
                "Y-1", f"variable name {name!r} must match [a-z][a-z0-9_]*", variable=name
            )
        _check_value(name, value)
        token = _Token()
        self._layer.variables[name] = (token, value)
        return Registration(lambda: _drop_named(self._layer.variables, name, token))

    def add_tools(self, provider: ToolsProvider) -> Registration:
        """Register a tools provider; providers merge across layers (Y-1)."""
        if not callable(provider):
            raise TypeError("a tools provider must be a zero-argument callable")
        token = _Token()
        self._layer.tools[token] = provider
        return Registration(lambda: _drop_token(self._layer.tools, token))

    def suppress_runtime_context(self) -> Registration:
        """Suppress runtime contexts for this layer and every scope below it (Y-2)."""
        token = _Token()
        self._layer.suppressors.add(token)
        return Registration(lambda: self._layer.suppressors.discard(token))

    def set_tool_order(self, names: Sequence[str]) -> Registration:
        """Set an explicit tool order (nearest layer's wins); validated at assemble (Y-3).

        Validation waits for assemble because only then are the tool names
        known (providers are dynamic and plugins load in any order).
        """
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise TypeError("a tool order is a sequence of tool names (str)")
        token = _Token()
        self._layer.tool_order = (token, tuple(names))

        def remover() -> None:
            current = self._layer.tool_order
            if current is not None and current[0] is token:
                self._layer.tool_order = None

        return Registration(remover)

    def add_assemble_hook(self, hook: AssembleHook) -> Registration:
        """Register a waterfall hook: receives the assembly, returns a (new) one (Y-2)."""
        if not callable(hook):
            raise TypeError("an assemble hook must be callable")
        token = _Token()
        self._layer.hooks[token] = hook
        return Registration(lambda: _drop_token(self._layer.hooks, token))


def _drop_named(table: dict[str, tuple[_Token, Any]], name: str, token: _Token) -> None:
    entry = table.get(name)
    if entry is not None and entry[0] is token:
        del table[name]


def _drop_token(table: dict[_Token, Any], token: _Token) -> None:
    table.pop(token, None)


def _check_value(name: str, value: object) -> None:
    """Only scalar values render unambiguously; non-finite floats are not JSON."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"variable {name!r}: value must be finite, got {value!r}")
        return
    raise TypeError(
        f"variable {name!r}: value must be str, int, float, bool or None, "
        f"got {type(value).__name__}"
    )


class Scope(_Registrar):
    """A scoped layer (e.g. an agent preset, or a sub-agent below it)."""

    def __init__(self, name: str, parent: str | None) -> None:
        self.name = name
        self.parent = parent
        self._layer = _Layer()

    def __repr__(self) -> str:
        return f"Scope({self.name!r}, parent={self.parent!r})"


class SystemPrompt(_Registrar):
    """Global layer plus a tree of scoped layers; assembles per scope (Y-1, Y-2)."""

    def __init__(self) -> None:
        self._layer = _Layer()
        self._scopes: dict[str, Scope] = {}

    def scope(self, name: str, parent: str | None = None) -> Scope:
        """Declare (or fetch) scope ``name`` below ``parent`` (``None`` = top level).

        The parent must already exist, which keeps the tree acyclic.  Calling
        again with the same parent returns the same :class:`Scope`; a different
        parent is a ``ValueError`` (a scope has one place in the tree).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"scope name must be a non-empty str, got {name!r}")
        existing = self._scopes.get(name)
        if existing is not None:
            if existing.parent != parent:
                raise ValueError(f"scope {name!r} already declared with parent {existing.parent!r}")
            return existing
        if parent is not None and parent not in self._scopes:
            raise ValueError(f"scope {name!r}: parent scope {parent!r} is not declared")
        created = Scope(name, parent)
        self._scopes[name] = created
        return created

    def get_scope(self, name: str) -> Scope:
        """The declared scope ``name`` (``PromptError`` rule ``Y-1`` when undeclared).

        Fetching needs no parent, unlike :meth:`scope`, whose parent argument is
        a declaration and therefore checked.
        """
        found = self._scopes.get(name)
        if found is None:
            raise PromptError("Y-1", f"unknown scope {name!r}")
        return found

    def scope_chain(self, scope: str | None) -> tuple[str, ...]:
        """Scope names far-to-near (root first, ``scope`` last); ``()`` for global."""
        if scope is None:
            return ()
        if scope not in self._scopes:
            raise PromptError("Y-1", f"unknown scope {scope!r}")
        chain: list[str] = []
        current: str | None = scope
        while current is not None:
            chain.append(current)
            current = self._scopes[current].parent
        return tuple(reversed(chain))

    # ------------------------------------------------------------ assemble

    def assemble(self, scope: str | None = None) -> Assembly:
        """Assemble the prompt for ``scope`` (``None`` = global only), per Y-2/Y-3."""
        chain = self.scope_chain(scope)
        layers = [self._layer, *(self._scopes[s]._layer for s in chain)]  # far-to-near

        # Suppressor: global or any ancestor, the scope itself included.
        suppressed = any(layer.suppressors for layer in layers)

        # Variables: global first, then far-to-near, so the nearest wins.
        variables: dict[str, VariableValue] = {}
        for layer in layers:
            for name, (_, value) in layer.variables.items():
                variables[name] = value
        frozen_vars: Mapping[str, VariableValue] = MappingProxyType(dict(variables))

        # Sections and contexts merged by name: nearer layers shadow.
        sections: dict[str, Section] = {}
        contexts: dict[str, ContextSection] = {}
        for layer in layers:
            for name, (_, section) in layer.sections.items():
                sections[name] = section
            for name, (_, context) in layer.contexts.items():
                contexts[name] = context

        tools = collect_tools(p for layer in layers for p in list(layer.tools.values()))

        tool_order: tuple[str, ...] | None = None
        for layer in layers:
            if layer.tool_order is not None:
                tool_order = layer.tool_order[1]
        tools = order_tools(tools, tool_order)

        active_sections = sorted(sections.values(), key=lambda s: (s.order, code_unit_key(s.name)))
        complete = [s for s in active_sections if s.complete]
        if len(complete) > 1:
            names = ", ".join(repr(s.name) for s in complete)
            raise PromptError(
                "Y-3",
                f"more than one complete section is active: {names}",
                section=complete[0].name,
            )
        ctx = AssembleContext(scope=scope, scope_chain=chain, variables=frozen_vars)
        assembled_sections = tuple(
            AssembledSection(
                name=s.name,
                order=s.order,
                text=_evaluate("section", s.name, s.text, ctx),
                interpolate=s.interpolate,
                complete=s.complete,
            )
            for s in active_sections
        )
        assembled_contexts: tuple[AssembledContext, ...] = ()
        if not suppressed:
            assembled_contexts = tuple(
                AssembledContext(
                    name=c.name, order=c.order, text=_evaluate("context", c.name, c.text, ctx)
                )
                # Y-2: by order only; equal orders keep merge (registration) order,
                # as the runtime's stable sort does (issue 17 item 1).
                for c in sorted(contexts.values(), key=lambda c: c.order)
            )

        assembly = Assembly(
            sections=assembled_sections,
            contexts=assembled_contexts,
            tools=tuple(tools),
            variables=frozen_vars,
        )

        for layer in layers:
            for hook in list(layer.hooks.values()):
                result = hook(assembly)
                if not isinstance(result, Assembly):
                    raise TypeError(
                        f"assemble hook {hook!r} returned {type(result).__name__}, "
                        "expected an Assembly"
                    )
                assembly = result

        # Every section is evaluated and hooks see them all (the runtime's order);
        # an active complete section is restored as the only one afterwards.
        complete_assembled = tuple(a for a in assembled_sections if a.complete)
        return _enforce(assembly, complete_assembled if complete else None, suppressed)


def _enforce(
    assembly: Assembly,
    complete_sections: tuple[AssembledSection, ...] | None,
    suppressed: bool,
) -> Assembly:
    """Restore the policies a hook must not undo (Y-2).

    A complete section is a deliberate "this is the whole prompt"; a
    suppressor is a deliberate "no runtime snapshot here".  A hook written for
    the general case must not accidentally reintroduce what they removed.
    """
    sections = tuple(assembly.sections)
    if complete_sections is not None:
        sections = complete_sections
    else:
        flagged = [s for s in sections if s.complete]
        if len(flagged) > 1:
            names = ", ".join(repr(s.name) for s in flagged)
            raise PromptError(
                "Y-3",
                f"assemble hooks produced more than one complete section: {names}",
                section=flagged[0].name,
            )
        if flagged:
            sections = (flagged[0],)
    contexts = () if suppressed else tuple(assembly.contexts)
    variables = assembly.variables
    if not isinstance(variables, MappingProxyType):
        variables = MappingProxyType(dict(variables))
    return replace(
        assembly,
        sections=sections,
        contexts=contexts,
        tools=tuple(assembly.tools),
        variables=variables,
    )


def _evaluate(kind: str, name: str, text: str | DynamicText, ctx: AssembleContext) -> str:
    """Evaluate a dynamic text once (Y-2) and insist on a str."""
    if isinstance(text, str):
        return text
    value = text(ctx)
    if not isinstance(value, str):
        raise TypeError(f"{kind} {name!r}: dynamic text returned {type(value).__name__}, not str")
    return value
