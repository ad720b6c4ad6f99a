"""Runs INSIDE a vLLM server's worker process, never in the learner: records the experts each
MoE layer routed every token to, per request, for routing replay (R3: Ma et al., "Stabilizing
MoE Reinforcement Learning by Aligning Training and Inference Routers", arXiv 2510.11370).

Why not vLLM's own `--enable-return-routed-experts`: in vLLM 0.32 it needs the V2 model runner
(VLLM_USE_V2_MODEL_RUNNER=1), which needs Triton with a CPU backend (triton-cpu); the CPU server
environment has neither (startup fails with "AuxOutput Connector requires Model Runner V2", then
"Model Runner V2 requires Triton"). This module does the same on the V1 model runner, with the
router hook vLLM's own capturer uses (`BaseRouter.set_capture_fn`, called with the top-k expert
ids before any expert-parallel remapping, i.e. logical ids).

Loaded with `--worker-extension-cls jaxrl_routing_capture.RoutingCaptureExtension` and this
folder on PYTHONPATH (`vllm_server_config.server_command`). It imports only numpy, torch and
vLLM: the server's environment has no jaxrl_llm. The client drives it over /collective_rpc:

  jaxrl_install_routing_capture()  hooks every MoE router and the model runner's execute_model
      (idempotent; the client calls it before each batch, so a weight reload cannot unhook it);
      returns {"num_layers", "top_k", "moe_layers"} or {"error": ...} for a dense model.
  jaxrl_take_routed_experts(key)   pops what was recorded for the requests whose
      `vllm_xargs` carried {"jaxrl_routing_key": key}: {child index: {"start", "npy_b64"}}.

Per scheduler step the runner forwards the scheduled tokens of every request back to back, in
the order of its input batch; request r's tokens sit at positions num_computed_tokens(r) ..
+ num_scheduled(r) - 1 of its sequence. Each step's rows are cut by that layout and appended to
the request's record. A sequence of P prompt and L sampled tokens is forwarded at positions
0 .. P + L - 2 (the last sampled token never is), so a finished request holds P + L - 1 rows.
Prompt tokens served from the prefix cache are not forwarded and get no rows: the server runs
with prefix caching off when this is on. Layers without a router (dense layers of a mixed
model) hold -1.
"""
from __future__ import annotations

import base64
import collections
import io
import re

import numpy as np
import torch

KEY_ARG = "jaxrl_routing_key"
MAX_KEPT_REQUESTS = 4096  # records nobody took (aborted batches) are dropped oldest first
_CHILD_ID = re.compile(r"^(\d+)_")  # vLLM names sample j of an n > 1 request f"{j}_{parent id}"


class RoutingRecorder:
    """The capture buffer of one worker and the per-request records cut from it."""

    def __init__(self, runner, num_layers: int, top_k: int, max_tokens: int):
        self.runner = runner
        self.num_layers, self.top_k = num_layers, top_k
        self.moe_layers: list[int] = []
        self.failure: str | None = None  # set when a step's rows were not all written
        self.buffer = torch.full((max_tokens, num_layers, top_k), -1, dtype=torch.int32)
        self.kept: collections.OrderedDict = collections.OrderedDict()  # (key, child) -> [(start, rows)]

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        self.buffer[: topk_ids.shape[0], layer] = topk_ids.to(torch.int32)

    def run_step(self, execute, scheduler_output, *args, **kwargs):
        """The runner's execute_model, then this step's rows cut into the requests' records."""
        total = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if total:
            self.buffer[:total].fill_(-1)
        output = execute(scheduler_output, *args, **kwargs)
        if total:
            rows = self.buffer[:total].numpy().astype(np.int16)
            unwritten = sorted({int(i) for i in np.nonzero((rows[:, self.moe_layers] < 0).any(axis=(0, 2)))[0]})
            if unwritten and self.failure is None:
                self.failure = (f"a step of {total} tokens ran without a router call in MoE layers "
                                f"{[self.moe_layers[i] for i in unwritten]} (a compiled model that skips the "
                                "capture hook? start the server with VLLMServerConfig(enforce_eager=True))")
            self._record(scheduler_output, rows)
        return output

    def _record(self, scheduler_output, rows: np.ndarray) -> None:
        starts = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        offset = 0
        for req_id in self.runner.input_batch.req_ids:  # the order the step's tokens were laid out in
            count = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            state = self.runner.requests.get(req_id)
            extra = getattr(getattr(state, "sampling_params", None), "extra_args", None) or {}
            if count and extra.get(KEY_ARG) is not None:
                match = _CHILD_ID.match(req_id)
                entry = (str(extra[KEY_ARG]), int(match.group(1)) if match else 0)
                self.kept.setdefault(entry, []).append((int(starts[req_id]), rows[offset:offset + count]))
                self.kept.move_to_end(entry)
            offset += count
        while len(self.kept) > MAX_KEPT_REQUESTS:
            self.kept.popitem(last=False)

    def take(self, key: str) -> dict:
        if self.failure is not None:
            return {"error": self.failure}
        out = {}
        for entry in [e for e in self.kept if e[0] == key]:
            chunks = sorted(self.kept.pop(entry), key=lambda chunk: chunk[0])
            start = chunks[0][0]
            expected = start
            for chunk_start, chunk in chunks:
                if chunk_start != expected:
                    return {"error": f"request {entry} has routing rows from position {start} with a gap at "
                                     f"{expected} (next rows start at {chunk_start})"}
                expected += len(chunk)
            out[str(entry[1])] = {"start": start, "npy_b64": _npy_b64(np.concatenate([c for _, c in chunks]))}
        return out


def _npy_b64(array: np.ndarray) -> str:
    with io.BytesIO() as buffer:
        np.save(buffer, array, allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def _moe_routers(model) -> list:
    """(layer index, router) of every MoE layer that routes with a vLLM BaseRouter."""
    from vllm.model_executor.layers.fused_moe.layer import MoERunner
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    return [(module.layer_id, module.router) for module in model.modules()
            if isinstance(module, MoERunner) and isinstance(module.router, BaseRouter)]


class RoutingCaptureExtension:
    """Methods added to vLLM's worker class (callable with /collective_rpc)."""

    def jaxrl_install_routing_capture(self) -> dict:
        runner = self.model_runner
        routers = _moe_routers(runner.get_model())
        if not routers:
            return {"error": "the served model has no MoE layer with a vLLM router; routed experts need a "
                             "mixture-of-experts model"}
        recorder = getattr(runner, "_jaxrl_routing", None)
        if recorder is None:
            config = runner.vllm_config
            num_layers = config.model_config.get_total_num_hidden_layers()
            top_k = config.model_config.get_num_experts_per_tok()
            recorder = RoutingRecorder(runner, num_layers, top_k, config.scheduler_config.max_num_batched_tokens)
            execute = runner.execute_model
            runner.execute_model = lambda *args, **kwargs: recorder.run_step(execute, *args, **kwargs)
            runner._jaxrl_routing = recorder
        recorder.moe_layers = sorted(layer for layer, _ in routers)
        for layer, router in routers:
            router.set_capture_fn(lambda ids, layer=layer: recorder.capture(layer, ids))
        return {"num_layers": recorder.num_layers, "top_k": recorder.top_k, "moe_layers": recorder.moe_layers}

    def jaxrl_take_routed_experts(self, key: str) -> dict:
        recorder = getattr(self.model_runner, "_jaxrl_routing", None)
        if recorder is None:
            return {"error": "routing capture is not installed (call jaxrl_install_routing_capture first)"}
        return recorder.take(str(key))
