"""The Tinker HTTP API (tinker SDK 0.38's routes, read from `tinker.resources`) as a Starlette app.

Direct answers: client/config, create_session, session_heartbeat, sessions/<id>/finish, get_info, create_sampling_session,
samplers/<id>, healthz, get_server_capabilities, telemetry. Futures (a request id at once, the
result through retrieve_future): create_model, forward_backward (forward too, `forward_only`),
optim_step, save_weights, load_weights, save_weights_for_sampler, asample.
Errors use the SDK's shape {"error": message, "category": "user" | "server"}: a failed future
answers it from retrieve_future (the SDK raises RequestFailedError with the message); a refused
direct call or an unsupported route answers it with an HTTP 4xx and `x-should-retry: false`.
Authentication: the X-API-Key header must equal the server's key (none in dev mode); only healthz
answers without it.
"""
from __future__ import annotations

import hmac
import json
import logging
import uuid
from typing import Any, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jaxrl_llm.serve.tinker import wire
from jaxrl_llm.serve.tinker.jobs import Batchable, Jobs, Result, UserError
from jaxrl_llm.serve.tinker.learner import padded_tokens
from jaxrl_llm.serve.tinker.sampling import SampleCall
from jaxrl_llm.serve.tinker.service import TinkerService

log = logging.getLogger(__name__)
PROTO = "application/x-protobuf"
# Server-side flags the SDK fetches first (tinker.types.ClientConfigResponse): plain API keys,
# uncompressed protobuf bodies, one retrieve_future per request.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "credential_default_source": "api_key", "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                 "sample_join_sampling_session": False, "use_pyqwest_transport": False}


def error_response(message: str, status: int = 400, category: str = "user") -> JSONResponse:
    return JSONResponse({"error": message, "category": category}, status_code=status,
                        headers={"x-should-retry": "false"})


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError as err:
        raise UserError(f"the body is not JSON ({err})") from err
    if not isinstance(body, dict):
        raise UserError("the body is not a JSON object")
    return body


def build_app(service: TinkerService, jobs: Jobs, api_key: str | None) -> Starlette:
    """The app; api_key None: dev mode, any key (or none) is accepted."""

    def direct(fn: Callable[[Request], Any], open_to_all: bool = False) -> Callable:
        async def endpoint(request: Request) -> Response:
            if not open_to_all and api_key is not None and \
                    not hmac.compare_digest(request.headers.get("x-api-key", ""), api_key):
                return error_response("missing or wrong X-API-Key for this jaxrl serve-tinker server", 401)
            try:
                out = await fn(request)
            except (UserError, ValueError, KeyError) as err:
                return error_response(f"{request.url.path.rsplit('/', 1)[-1]}: {err}")
            return out if isinstance(out, Response) else JSONResponse(out)
        return endpoint

    def future(name: str, key: Callable[[dict], Any], run: Callable[[dict], Result]) -> Callable:
        async def fn(request: Request) -> dict:
            body = await _json(request)
            request_id = jobs.submit(key(body), name, lambda: run(body), owner=body.get("model_id"))
            return {"request_id": request_id, "model_id": body.get("model_id")}
        return direct(fn)

    async def retrieve(request: Request) -> Response:
        request_id = (await _json(request)).get("request_id")
        if not isinstance(request_id, str) or not jobs.known(request_id):
            # 410: the SDK retries the original call (a server restarted since it was sent)
            return error_response(f"retrieve_future: request_id={request_id!r} is unknown to this server", 410)
        result = await jobs.wait(request_id)
        if result is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if result.error is not None:
            return JSONResponse(result.failure_body())
        if result.proto is not None:
            return Response(result.proto, media_type=PROTO)
        return JSONResponse(result.json)

    def train_all(calls: list[wire.ForwardBackwardCall]) -> list[Result | Exception]:
        return [o if isinstance(o, Exception) else Result(proto=wire.forward_backward_output(*o, len(c.data)))
                for c, o in zip(calls, service.train(calls))]

    async def forward_backward(request: Request) -> dict:
        call = wire.parse_forward_backward(await request.body())
        name = "forward" if call.forward_only else "forward_backward"
        batch = Batchable(service.batch_key(call), call, train_all, size=padded_tokens(call.data))
        request_id = jobs.submit((call.model_id, call.seq_id), name, owner=call.model_id, batch=batch)
        return {"request_id": request_id, "model_id": call.model_id}

    async def asample(request: Request) -> dict:
        body = await _json(request)
        session_id = body.get("sampling_session_id")
        service.sampling_session(session_id)  # unknown session: refused at once
        prompt = [t for chunk in body.get("prompt", {}).get("chunks", []) for t in _chunk_tokens(chunk)]
        call = SampleCall(np.asarray(prompt, np.int32), int(body.get("num_samples", 1)),
                          body.get("sampling_params") or {}, bool(body.get("prompt_logprobs")))
        _check_unsupported_sampling(body)

        def run() -> Result:
            sequences, prompt_logprobs = service.sample(session_id, call)
            return Result(proto=wire.sample_response(sequences, prompt_logprobs))
        key = None if body.get("seq_id") is None else (session_id, body["seq_id"])
        request_id = jobs.submit(key, "sample", run, owner=session_id)
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-{i}" for i in range(call.num_samples)]}

    async def create_session(request: Request) -> dict:
        return {"type": "create_session", "session_id": service.new_session(await _json(request))}

    async def heartbeat(request: Request) -> Response:
        session_id = (await _json(request)).get("session_id")
        if session_id in service.finished_sessions:  # 410: the SDK stops this session's heartbeat loop
            return error_response(f"session_heartbeat: session {session_id!r} has finished", 410)
        return JSONResponse({"type": "session_heartbeat"})

    async def finish_session(request: Request) -> Response:
        service.finished_sessions.add(request.path_params["session_id"])
        return JSONResponse(None)

    async def get_info(request: Request) -> dict:
        return service.info((await _json(request)).get("model_id"))

    async def create_sampling_session(request: Request) -> dict:
        return {"type": "create_sampling_session", "sampling_session_id": service.new_sampling_session(await _json(request))}

    async def sampler_info(request: Request) -> dict:
        session_id = request.path_params["sampler_id"]
        session = service.sampling_session(session_id)
        return {"sampler_id": session_id, "base_model": session.base_model, "model_path": session.model_path}

    async def capabilities(request: Request) -> dict:
        return {"supported_models": [{"model_name": name, "max_context_length": base.cfg.max_position_embeddings,
                                      "trainable": True, "sampleable": True} for name, base in service.bases.items()]}

    def answer(payload: dict, open_to_all: bool = False) -> Callable:
        async def fn(request: Request) -> dict:
            return payload
        return direct(fn, open_to_all)

    def as_json(fn: Callable[[dict], Any]) -> Callable[[dict], Result]:
        return lambda body: Result(json=fn(body))

    async def unsupported(request: Request) -> Response:
        call = request.url.path.removeprefix("/api/v1/")
        return error_response(f"{call}: {request.method} {request.url.path} is not supported by jaxrl serve-tinker "
                              "(docs/tinker.md lists what is)", 404)

    routes = [
        Route("/api/v1/healthz", answer({"status": "ok"}, open_to_all=True), methods=["GET"]),  # liveness, no key
        Route("/api/v1/client/config", answer(CLIENT_CONFIG), methods=["POST"]),
        Route("/api/v1/client/dynamic_config", answer({}), methods=["POST"]),
        Route("/api/v1/telemetry", answer({"status": "accepted"}), methods=["POST"]),
        Route("/api/v1/get_server_capabilities", direct(capabilities), methods=["GET"]),
        Route("/api/v1/create_session", direct(create_session), methods=["POST"]),
        Route("/api/v1/session_heartbeat", direct(heartbeat), methods=["POST"]),
        Route("/api/v1/sessions/{session_id}/finish", direct(finish_session), methods=["POST"]),
        Route("/api/v1/get_info", direct(get_info), methods=["POST"]),
        Route("/api/v1/create_sampling_session", direct(create_sampling_session), methods=["POST"]),
        Route("/api/v1/samplers/{sampler_id}", direct(sampler_info), methods=["GET"]),
        Route("/api/v1/retrieve_future", direct(retrieve), methods=["POST"]),
        Route("/api/v1/forward_backward", direct(forward_backward), methods=["POST"]),
        Route("/api/v1/asample", direct(asample), methods=["POST"]),
        Route("/api/v1/create_model", future(
            "create_model", lambda b: (b.get("session_id"), "model", b.get("model_seq_id")),
            as_json(service.create_model)), methods=["POST"]),
        Route("/api/v1/optim_step", future(
            "optim_step", _seq_key, as_json(service.optim_step)), methods=["POST"]),
        Route("/api/v1/save_weights", future(
            "save_weights", _seq_key, as_json(lambda b: {"path": service.save(b, "weights"), "type": "save_weights"})),
            methods=["POST"]),
        Route("/api/v1/load_weights", future(
            "load_weights", lambda b: _seq_key(b) if b.get("model_id") else (b.get("session_id"), "model",
                                                                            b.get("model_seq_id")),
            as_json(service.load)), methods=["POST"]),
        Route("/api/v1/save_weights_for_sampler", future(
            "save_weights_for_sampler", _seq_key, as_json(service.save_for_sampler)), methods=["POST"]),
        Route("/{path:path}", direct(unsupported), methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    return Starlette(routes=routes)


def _seq_key(body: dict):
    return None if body.get("seq_id") is None else (body.get("model_id"), body["seq_id"])


def _chunk_tokens(chunk: dict) -> list[int]:
    if chunk.get("type", "encoded_text") != "encoded_text":
        raise UserError(f"a {chunk.get('type')!r} prompt chunk; valid: encoded_text (token ids) only")
    return list(chunk.get("tokens", []))


def _check_unsupported_sampling(body: dict) -> None:
    asked = {name: body.get(name) for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")
             if body.get(name)}
    asked.update({name: body[name] for name in ("target_prompt_logprobs", "prompt_logprobs_last_n",
                                                "record_stability_info") if body.get(name)})
    if asked:
        raise UserError(f"sample options {sorted(asked)} are not supported by jaxrl serve-tinker; valid: "
                        "num_samples, sampling_params (max_tokens, seed, stop, temperature, top_k, top_p), "
                        "prompt_logprobs")


def new_api_key() -> str:
    return f"tml-{uuid.uuid4().hex}"
