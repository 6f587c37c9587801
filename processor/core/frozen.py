"""Deep-frozen JSON values.

Events are the only truth, and every message the model sees is borrowed from an
event.  Freezing event data once, at the edge, lets the surface, the derived
message list and built requests share one object per message (G-2, F-2) without
defensive copies: a plugin that tries to mutate a message gets a TypeError
instead of silently rewriting history.

``FrozenDict`` and ``FrozenList`` subclass ``dict`` and ``list`` so equality,
``isinstance`` checks and JSON encoders (json, orjson) keep working unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from processor.core.freezing import freeze as freeze
from processor.core.frozen_types import MAX_DEPTH as MAX_DEPTH
from processor.core.frozen_types import FrozenDict as FrozenDict
from processor.core.frozen_types import FrozenList as FrozenList
from processor.core.frozen_types import JsonDepthError as JsonDepthError
from processor.core.frozen_types import frozen_dict_of as frozen_dict_of
from processor.core.frozen_types import thaw as thaw


def json_problem(value: Any, path: str = "data", _depth: int = 0) -> str | None:
    """Describe why ``value`` is not plain JSON, or return None when it is.

    Plain JSON: dict with str keys, list, str, bool, None, int, finite float,
    nested at most :data:`MAX_DEPTH` levels.
    """
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} holds a non-finite number"
    if isinstance(value, dict | list | tuple) and _depth >= MAX_DEPTH:
        return f"{path} nests deeper than {MAX_DEPTH} levels"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key {k!r}"
            problem = json_problem(v, f"{path}.{k}", _depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = json_problem(v, f"{path}[{i}]", _depth + 1)
            if problem:
                return problem
        return None
    return f"{path} holds a non-JSON value of type {type(value).__name__}"
