"""Without a server: a mixture-of-experts model's server loads the worker extension (routed
experts capture + the MoE weight reload) even without return_routed_experts, and weight sync
reloads a MoE export with the extension's "jaxrl_reload_weights" (vllm_worker/jaxrl_moe_reload.py
says why), a dense one with vLLM's "reload_weights"."""
import json
from pathlib import Path

from jaxrl_llm.rollout.vllm_server_config import ROUTING_CAPTURE_EXTENSION, VLLMServerConfig, server_command, server_env
from jaxrl_llm.rollout.weight_sync import reload_method


def model_dir(path: Path, **config) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "x", **config}))
    return path


def test_a_moe_server_loads_the_worker_extension_without_routed_experts(tmp_path):
    moe = VLLMServerConfig(model_dir=model_dir(tmp_path / "moe", num_experts=8, num_experts_per_tok=2))
    command = server_command(moe, Path("python"), 8000)
    assert command[command.index("--worker-extension-cls") + 1] == ROUTING_CAPTURE_EXTENSION
    assert "--no-enable-prefix-caching" not in command  # prefix caching stays on without routing capture
    folder = Path(server_env(moe)["PYTHONPATH"])
    assert all((folder / f"{name}.py").is_file() for name in ("jaxrl_worker", "jaxrl_moe_reload",
                                                               "jaxrl_routing_capture"))
    dense = VLLMServerConfig(model_dir=model_dir(tmp_path / "dense", num_experts=0))
    assert "--worker-extension-cls" not in server_command(dense, Path("python"), 8000)
    assert "PYTHONPATH" not in server_env(dense)


def test_weight_sync_reloads_a_moe_export_with_the_repacking_reload(tmp_path):
    assert reload_method(model_dir(tmp_path / "qwen3_moe", num_experts=4)) == "jaxrl_reload_weights"
    assert reload_method(model_dir(tmp_path / "mixtral", num_local_experts=8)) == "jaxrl_reload_weights"
    assert reload_method(model_dir(tmp_path / "dense", num_experts=0)) == "reload_weights"
    assert reload_method(model_dir(tmp_path / "llama")) == "reload_weights"
