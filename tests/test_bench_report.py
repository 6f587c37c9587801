"""The bench's renderer never writes over the curated BENCHMARKS.md."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench import report
from bench.common import RESULTS


def test_the_report_goes_to_its_own_file_not_benchmarks_md(tmp_path: Path) -> None:
    # BENCHMARKS.md holds hand-written before/after sections that no JSON
    # result holds; a render over it once wiped them.
    assert report.REPORT.name == "REPORT.md"
    assert report.REPORT.parent == RESULTS
    shutil.copy(RESULTS / "fold_speed.json", tmp_path / "fold_speed.json")
    target = tmp_path / "REPORT.md"
    assert report.write(tmp_path, target) == target
    assert "Core fold speed" in target.read_text()
