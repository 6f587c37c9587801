"""A compiled build folds exactly as the pure-Python source (issue 15).

The shipped mypyc build (``PROCESSOR_MYPYC=1``, setup.py) compiles the same
source; a difference in semantics between compiled and interpreted code
(integer overflow, ``is`` on small values, attribute defaults) would change
a fold silently.  ``scripts/test_compiled.sh`` installs the compiled wheel,
runs the whole suite against it and names the checkout in
``PROCESSOR_PURE_SOURCE``: here every log is folded in this process
(compiled) and by a child interpreter importing the source, and the printed
output, the session checkpoint, the last digest and every refusal must be
the same bytes.  Without a compiled build under test there is nothing to
compare, and the test is skipped.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import processor.core.session
from processor.core.errors import SessionError
from processor.files import SessionFileError, write_session_file
from processor.offline import fold_file
from processor.workload import generate_session

CORPUS = Path(__file__).parents[1] / "corpus"
PURE = os.environ.get("PROCESSOR_PURE_SOURCE")
COMPILED = not str(processor.core.session.__file__).endswith(".py")

pytestmark = pytest.mark.skipif(
    not (COMPILED and PURE), reason="needs a compiled build and PROCESSOR_PURE_SOURCE"
)

#: Runs in the child with the source first on sys.path: one line per file.
_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import processor.core.session
assert str(processor.core.session.__file__).endswith(".py"), "child must run the source"
from tests.core.test_compiled_parity import fold_fingerprint
for path in sys.argv[2:]:
    print(fold_fingerprint(path))
"""


def fold_fingerprint(path: str) -> str:
    """Digest of everything a fold of ``path`` shows, or the refusal's text."""
    try:
        result = fold_file(path)
    except (SessionError, SessionFileError) as exc:
        return f"refused: {exc}"
    blob = b"\n".join(
        [
            orjson.dumps(result.output),
            orjson.dumps(result.session_checkpoint),
            str(result.session.last_digest).encode(),
        ]
    )
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def _generated(tmp: Path) -> list[Path]:
    rng = random.Random(15)
    paths = []
    for i in range(24):
        form = 3 if i % 2 else 4
        n = rng.choice([1, 2, 7, 30, 120, 400])
        path = tmp / f"gen-{i}-v{form}.jsonl"
        write_session_file(path, None, generate_session(random.Random(i), n, form=form))
        paths.append(path)
    big = tmp / "gen-big.jsonl"
    write_session_file(big, None, generate_session(random.Random(99), 5000))
    return [*paths, big]


def test_compiled_and_pure_folds_are_identical(tmp_path: Path) -> None:
    assert PURE is not None
    corpus = sorted(p for p in CORPUS.rglob("*") if ".jsonl" in p.name)
    paths = [*_generated(tmp_path), *corpus]
    assert len(corpus) > 50
    here = [fold_fingerprint(str(p)) for p in paths]
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, PURE, *map(str, paths)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    there = child.stdout.splitlines()
    assert len(there) == len(paths)
    for path, mine, theirs in zip(paths, here, there, strict=True):
        assert mine == theirs, path.name
    assert any(f.startswith("refused:") for f in here)  # the invalid corpus was folded too
