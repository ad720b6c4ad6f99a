"""What the server holds: base models (loaded once, shared), each client's training model
(its own LoRA adapters and optimiser state), sampling sessions (a base model and, for a saved
sampler, a fixed copy of the adapters), and checkpoints on disk:

  state_dir/<model_id>/weights/<name>/          save_weights (save_state): adapters + optimiser, orbax
  state_dir/<model_id>/sampler_weights/<name>/  save_weights_for_sampler with a name: adapters, orbax

each with meta.json (base model, LoRA config). A checkpoint is named tinker://<model_id>/<kind>/<name>;
a server restarted on the same state_dir loads the checkpoints of the one before it.
The methods here run on the jobs' worker thread (one at a time) or are read-only lookups.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_llm.serve.tinker import adapters as lora
from jaxrl_llm.serve.tinker import sampling
from jaxrl_llm.serve.tinker.jobs import UserError
from jaxrl_llm.serve.tinker.learner import (MICRO_BATCH_TOKENS, Learner, TrainCall, TrainingModel, new_optimizer_state,
                                            padded_width)
from jaxrl_llm.serve.tinker.wire import ForwardBackwardCall

log = logging.getLogger(__name__)
PREFIX = "tinker://"


@dataclasses.dataclass
class BaseModel:
    name: str
    model_dir: str
    cfg: Any
    params: dict
    learner: Learner
    sampler: Any  # rollout.JaxSampler
    decode: Any  # token ids -> text


@dataclasses.dataclass(frozen=True)
class SamplingSession:
    base_model: str
    adapters: dict | None  # None: the base model itself
    scale: float
    model_path: str | None


_merge = jax.jit(lora.merge, static_argnames="scale")
# A sample call holds one prompt: rounding its prompt rows up to the sampler's default batch bucket (8)
# prefilled 8 rows for 1 (SmolLM2, 40-token prompt, 4 x 5 tokens: 1.5-1.8 s a call at bucket 1, 4.7-5.9 s at 8).
SAMPLE_BATCH_BUCKET = 1


def load_base_model(name: str, micro_batch_tokens: int = MICRO_BATCH_TOKENS) -> BaseModel:
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.train.policy import load_policy

    policy = load_policy(name)
    cfg, params = lora.untied(policy.cfg, policy.params)
    sampler = JaxSampler(cfg, params, eos_token_ids=policy.eos_token_ids, pad_id=policy.pad_id, compactions=0,
                         batch_bucket=SAMPLE_BATCH_BUCKET)
    return BaseModel(name, policy.model_dir, cfg, params, Learner(cfg, params, micro_batch_tokens), sampler,
                     lambda ids: policy.tokenizer.decode(ids, skip_special_tokens=False))


def _committed(tree: Any) -> Any:
    """The arrays on the default device, committed, as the jitted programs return them: a fresh or
    loaded model's first call then runs the program its later calls run (jit compiles again for
    uncommitted inputs)."""
    return jax.device_put(tree, jax.devices()[0])


def _parse_path(path: str) -> tuple[str, str, str]:
    parts = path[len(PREFIX):].split("/") if path.startswith(PREFIX) else []
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not all(parts):
        raise UserError(f"path={path!r}; valid: tinker://<model_id>/weights/<name> or "
                        "tinker://<model_id>/sampler_weights/<name>")
    return parts[0], parts[1], parts[2]


def model_id_of(request: dict) -> str:
    """The id the SDK derives for a session's n-th training client (ServiceClient, tinker 0.38)."""
    session_id, seq = request.get("session_id"), request.get("model_seq_id")
    if not isinstance(session_id, str) or not isinstance(seq, int):
        raise UserError(f"session_id={session_id!r}, model_seq_id={seq!r}; valid: a session id and an integer")
    return f"{session_id}:train:{seq}"


class TinkerService:
    def __init__(self, base_models: dict[str, BaseModel], state_dir: str | os.PathLike, seed: int = 0):
        self.bases = base_models
        self.state_dir = Path(state_dir).absolute()  # orbax refuses relative checkpoint paths
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.models: dict[str, TrainingModel] = {}
        self.sampling_sessions: dict[str, SamplingSession] = {}
        self.sessions: dict[str, dict] = {}
        self.finished_sessions: set[str] = set()
        self._seed = seed
        self._lock = threading.Lock()
        self._checkpointer = ocp.StandardCheckpointer()

    # ------------------------------------------------------------------ lookups
    def base(self, name: str | None) -> BaseModel:
        if name not in self.bases:
            raise UserError(f"base_model={name!r} is not served here; valid: {sorted(self.bases)}")
        return self.bases[name]

    def model(self, model_id: str | None) -> TrainingModel:
        if model_id not in self.models:
            raise UserError(f"model_id={model_id!r} is not a model of this server (create_model first)")
        return self.models[model_id]

    def sampling_session(self, session_id: str | None) -> SamplingSession:
        if session_id not in self.sampling_sessions:
            raise UserError(f"sampling_session_id={session_id!r} is unknown: save weights for a sampler first "
                            "(save_weights_and_get_sampling_client / save_weights_for_sampler)")
        return self.sampling_sessions[session_id]

    def new_session(self, request: dict) -> str:
        session_id = f"session-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.sessions[session_id] = {"sdk_version": request.get("sdk_version"), "tags": request.get("tags")}
        return session_id

    # ------------------------------------------------------------------ training models
    def create_model(self, request: dict) -> dict:
        base = self.base(request.get("base_model"))
        config = lora.adapter_config(request.get("lora_config"), base.cfg, default_seed=self._seed)
        optimizer = (request.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer_config.type={optimizer!r}; valid: 'adamw'")
        return self._add_model(base, config, model_id_of(request))

    def _add_model(self, base: BaseModel, config: lora.AdapterConfig, model_id: str) -> dict:
        adapters = _committed(lora.init_adapters(base.params, config))
        self.models[model_id] = TrainingModel(model_id, base.name, config, adapters,
                                              _committed(new_optimizer_state(adapters)))
        return {"model_id": model_id, "type": "create_model"}

    def info(self, model_id: str) -> dict:
        model = self.model(model_id)
        base = self.bases[model.base_model]
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": model.config.rank,
                "model_name": base.name, "model_data": {"arch": base.cfg.family, "model_name": base.name,
                                                        "tokenizer_id": base.model_dir}}

    def batch_key(self, call: ForwardBackwardCall) -> tuple:
        """Calls with equal keys can run as one forward: same kind, base model and padded width."""
        model = self.models.get(call.model_id)
        return (call.forward_only, model and model.base_model, padded_width(call.data))

    def train(self, calls: list[ForwardBackwardCall]) -> list[tuple[dict, dict] | Exception]:
        """forward / forward_backward calls of one batch key and distinct models, as one forward;
        per call its (outputs, metrics), or the error that refused it (the others still run)."""
        outcomes: list[Any] = []
        for call in calls:
            try:
                model = self.model(call.model_id)
                train_call = TrainCall(model, call.loss_fn, call.loss_fn_config, call.data)
                self.bases[model.base_model].learner.check(train_call, backward=not call.forward_only)
                outcomes.append(train_call)
            except (UserError, ValueError) as err:
                outcomes.append(err)
        accepted = [o for o in outcomes if isinstance(o, TrainCall)]
        if accepted:
            learner = self.bases[accepted[0].model.base_model].learner
            results = iter(learner.run(accepted, backward=not calls[0].forward_only))
            outcomes = [next(results) if isinstance(o, TrainCall) else o for o in outcomes]
        return outcomes

    def optim_step(self, request: dict) -> dict:
        model = self.model(request.get("model_id"))
        adam = request.get("adam_params") or request.get("optim_params")
        if adam is None:
            raise UserError(f"optim_step without adam_params (got {request.get('optimizer_params')!r}); "
                            "valid: AdamParams")
        metrics = self.bases[model.base_model].learner.optim_step(model, adam)
        return {"metrics": metrics, "type": "optim_step"}

    # ------------------------------------------------------------------ checkpoints
    def _dir(self, model_id: str, kind: str, name: str) -> Path:
        return self.state_dir / model_id / kind / name

    def _meta(self, model: TrainingModel) -> dict:
        return {"base_model": model.base_model, **dataclasses.asdict(model.config), "steps": model.steps}

    def save(self, request: dict, kind: str) -> str:
        """Writes the model's adapters (kind "weights": with its optimiser state) under its name."""
        model = self.model(request.get("model_id"))
        name = request.get("path") or f"{kind}-{model.steps:06d}-{uuid.uuid4().hex[:6]}"
        if "/" in name or name in (".", ".."):
            raise UserError(f"path={name!r}; valid: a name without '/'")
        out = self._dir(model.model_id, kind, name)
        if out.exists():
            raise UserError(f"{PREFIX}{model.model_id}/{kind}/{name} exists already; valid: a new name")
        tree = {"adapters": model.adapters}
        if kind == "weights":
            tree["opt_state"] = model.opt_state
        out.parent.mkdir(parents=True, exist_ok=True)
        self._checkpointer.save(out / "state", tree)
        self._checkpointer.wait_until_finished()
        (out / "meta.json").write_text(json.dumps(self._meta(model)))
        return f"{PREFIX}{model.model_id}/{kind}/{name}"

    def _read(self, path: str, with_optimizer: bool) -> tuple[dict, dict]:
        model_id, kind, name = _parse_path(path)
        where = self._dir(model_id, kind, name)
        if not (where / "meta.json").is_file():
            raise UserError(f"no checkpoint at {path} on this server")
        meta = json.loads((where / "meta.json").read_text())
        base = self.base(meta["base_model"])
        config = lora.AdapterConfig(meta["rank"], meta["seed"], tuple(meta["targets"]), meta["unembed"])
        adapters = lora.init_adapters(base.params, config)
        target = {"adapters": adapters}
        if with_optimizer and kind != "weights":
            raise UserError(f"{path} holds sampler weights only; the optimiser state is in tinker://.../weights/")
        if kind == "weights":  # written with its optimiser state; read whole, kept if asked for
            target["opt_state"] = new_optimizer_state(adapters)
        restored = self._checkpointer.restore(where / "state", jax.tree.map(np.asarray, target))
        if not with_optimizer:
            restored.pop("opt_state", None)
        return meta, restored

    def load(self, request: dict) -> dict:
        """load_weights: into an existing model, or (session_id + model_seq_id) a new model from it."""
        meta, state = self._read(request["path"], bool(request.get("optimizer")))
        config = lora.AdapterConfig(meta["rank"], meta["seed"], tuple(meta["targets"]), meta["unembed"])
        if request.get("model_id") is None:
            model_id = self._add_model(self.base(meta["base_model"]), config, model_id_of(request))["model_id"]
        else:
            model_id = request["model_id"]
        model = self.model(model_id)
        if model.base_model != meta["base_model"] or model.config.rank != config.rank:
            raise UserError(f"{request['path']} is a rank-{config.rank} adapter of {meta['base_model']!r}; "
                            f"model {model_id} is rank {model.config.rank} on {model.base_model!r}")
        model.adapters = _committed(state["adapters"])
        if "opt_state" in state:
            model.opt_state = _committed(state["opt_state"])
        model.grads = None
        return {"path": request["path"], "model_id": model_id, "type": "load_weights"}

    # ------------------------------------------------------------------ sampling
    def save_for_sampler(self, request: dict) -> dict:
        """Named: a checkpoint on disk (its path). Unnamed: an ephemeral sampling session holding
        this moment's adapters (its id)."""
        model = self.model(request.get("model_id"))
        if request.get("path"):
            return {"path": self.save(request, "sampler_weights"), "type": "save_weights_for_sampler"}
        session_id = f"sampler-{uuid.uuid4().hex[:16]}"
        self.sampling_sessions[session_id] = SamplingSession(model.base_model, model.adapters, model.config.scale, None)
        return {"sampling_session_id": session_id, "type": "save_weights_for_sampler"}

    def new_sampling_session(self, request: dict) -> str:
        path, base_name = request.get("model_path"), request.get("base_model")
        if path:
            meta, state = self._read(path, with_optimizer=False)
            session = SamplingSession(meta["base_model"], state["adapters"], lora.LORA_ALPHA / meta["rank"], path)
        else:
            session = SamplingSession(self.base(base_name).name, None, 1.0, None)
        session_id = f"sampler-{uuid.uuid4().hex[:16]}"
        self.sampling_sessions[session_id] = session
        return session_id

    def sample(self, session_id: str, call: sampling.SampleCall):
        session = self.sampling_session(session_id)
        base = self.bases[session.base_model]
        params = base.params if session.adapters is None else _merge(base.params, session.adapters, session.scale)
        return sampling.sample(base.sampler, params, base.cfg, base.decode, call)
