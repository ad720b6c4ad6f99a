"""No module of jaxrl_llm/ is over MAX_LINES lines: a file that long holds more than one concern
and should be split by what it holds (docs/architecture.md)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def long_files(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every .py file under `root` with more than `limit` lines: path (relative to root) -> lines."""
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py"))}
    return {path: n for path, n in sizes.items() if n > limit}


def test_long_files_counts_lines_by_hand(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * 400)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 401)
    (tmp_path / "pkg" / "notes.txt").write_text("x\n" * 1000)
    assert long_files(tmp_path) == {"pkg/long.py": 401}


def test_no_module_over_the_limit():
    over = long_files(REPO / "jaxrl_llm")
    assert not over, (f"files over {MAX_LINES} lines (split each by what it holds): "
                      + ", ".join(f"jaxrl_llm/{p} ({n})" for p, n in sorted(over.items())))
