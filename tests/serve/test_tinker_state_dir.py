"""`jaxrl serve-tinker --state-dir runs/x` (a relative path): orbax refuses relative checkpoint paths, so the
service keeps its state directory absolute (a cookbook run against a relative --state-dir failed at its final
save_state: "Checkpoint path should be absolute")."""
from __future__ import annotations


def test_a_relative_state_dir_is_kept_absolute(tmp_path, monkeypatch):
    from jaxrl_llm.serve.tinker.service import TinkerService

    monkeypatch.chdir(tmp_path)
    service = TinkerService({}, "runs/state")
    assert service.state_dir == tmp_path / "runs" / "state" and (tmp_path / "runs" / "state").is_dir()
