"""The result file of `make gpu-check` (`benchmarks.gpu.gpu_check`): time-budgeted sections, the JSON
rewritten after each one (a run cut short keeps what it measured), and its tables as markdown."""
from __future__ import annotations

import datetime
import json
import platform
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import jax

from jaxrl_llm.benchmarks.common.results import device_slug, git_commit
from jaxrl_llm.utils.atomic_files import write_text_atomic

class Report:
    """The result file, rewritten after every section."""

    def __init__(self, out_dir: Path, tiny: bool, budget_s: float, tag: str = ""):
        device = jax.devices()[0]
        self.start = time.time()
        self.budget_s = budget_s
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        kind = device.device_kind if device.platform != "cpu" else f"cpu-{platform.machine()}"
        self.path = out_dir / f"gpu-check-{device_slug(kind)}{'-tiny' if tiny else ''}-{date}{tag}.json"
        self.data: dict[str, Any] = {
            "device": kind, "platform": device.platform, "date": date, "commit": git_commit(), "tiny": tiny,
            "jax": jax.__version__, "budget_s": budget_s, "sections": {}, "learner": [],
            "learner_flop_formula": "6*N_body*tokens + 6*D*V*completion_tokens + 12*L*H*hd*sum_i L_i(L_i+1)/2 "
                                    "(LM head on completion tokens only; no recompute counted)"}

    def elapsed(self) -> float:
        return time.time() - self.start

    def section(self, name: str, estimate_s: float, fn: Callable[[], Any]) -> Any:
        """Run fn if `estimate_s` fits the remaining budget; record its result, error or skip."""
        if self.elapsed() + estimate_s > self.budget_s:
            self.data["sections"][name] = {"status": "skipped", "reason": f"needs ~{estimate_s:.0f} s, "
                                           f"{self.budget_s - self.elapsed():.0f} s left of the budget"}
            print(f"[gpu-check] {name}: skipped (time budget)", flush=True)
            self.write()
            return None
        print(f"[gpu-check] {name} (t={self.elapsed():.0f} s) ...", flush=True)
        t0 = time.time()
        try:
            result = fn()
            self.data["sections"][name] = {"status": "ok", "wall_s": time.time() - t0}
        except Exception as error:  # noqa: BLE001 -- a failed section is a result too; the rest still runs
            result = None
            self.data["sections"][name] = {"status": "failed", "wall_s": time.time() - t0,
                                           "error": f"{type(error).__name__}: {error}"[:2000],
                                           "traceback": traceback.format_exc()[-4000:]}
            print(f"[gpu-check] {name} FAILED: {type(error).__name__}: {error}"[:600], flush=True)
        self.write()
        return result

    def write(self) -> None:
        self.data["wall_s"] = self.elapsed()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(self.data, indent=2, default=float))
        self.path.with_suffix(".md").write_text(markdown(self.data))


def attention_path(data: dict[str, Any]) -> str:
    """Which attention the run's packed learner rows took on the device."""
    if data.get("platform") == "cpu":
        return "XLA (CPU)"
    return "cuDNN with a dense mask" if data.get("cudnn_segments_disabled") else "cuDNN segment spans"


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f} %"


def markdown(data: dict[str, Any]) -> str:
    """The result file as tables (docs/benchmarks.md's accelerator tables are generated from the JSON)."""
    lines = [f"# gpu-check: {data['device']}, {data['date']}, commit {data['commit']}", "",
             f"jax {data['jax']}; wall {data.get('wall_s', 0):.0f} s of a {data['budget_s']:.0f} s budget; "
             f"packed rows' attention: {attention_path(data)}.", ""]
    for key in ("commit_note", "notes"):
        if data.get(key):
            lines += [f"Note: {data[key]}", ""]
    ceilings = data.get("ceilings") or {}
    if ceilings:
        lines += [f"Measured: bf16 matmul {ceilings.get('matmul_tflops', 0):.0f} TFLOP/s, copy "
                  f"{ceilings.get('copy_gb_s', 0):.0f} GB/s; datasheet bf16 peak {ceilings.get('peak_tflops')}.", ""]
    if data["learner"]:
        lines += ["## Learner (`Learner.update`, bf16, RL length mix)", "",
                  f"FLOPs: {data['learner_flop_formula']}", "",
                  "| model | tokens/step | layout | padding | remat | s/step | tokens/s | TFLOP/s | MFU | of matmul |",
                  "|---|---:|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in data["learner"]:
            lines.append(f"| {r['model']} | {r['tokens_per_step']} | {'packed' if r['pack'] else 'one per row'} | "
                         f"{_pct(r['padding_fraction'])} | {r['remat']} | {r['seconds']:.3f} | "
                         f"{r['tokens_per_s']:.0f} | {r['model_tflops']:.1f} | {_pct(r['mfu'])} | "
                         f"{_pct(r['fraction_of_matmul_ceiling'])} |")
        lines.append("")
    lines += moe_lines(data["learner"])
    lines += torch_lines(data)
    lines += lever_lines(data.get("learner_phases"))
    lines += invariance_lines(data.get("batch_invariance"))
    for name in ("attention", "sampler", "rl_run", "rl_step"):
        if data.get(name) is not None:
            lines += [f"## {name}", "", "```json", json.dumps(data[name], indent=1, default=float)[:6000], "```", ""]
    lines += ["## Sections", "", "| section | status | wall s | note |", "|---|---|---:|---|"]
    for name, s in data["sections"].items():
        note = s.get("error") or s.get("reason") or ""
        lines.append(f"| {name} | {s['status']} | {s.get('wall_s', 0):.1f} | {note[:200]} |")
    return "\n".join(lines) + "\n"


def moe_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The mixture-of-experts rows again: MFU on active parameters next to the dense work the device did."""
    moe = [r for r in rows if r.get("moe")]
    if not moe:
        return []
    lines = ["### Mixture of experts: MFU on active parameters", "",
             "Experts \"dense\": every expert on every token, E/k times the experts' needed FLOPs; \"ragged\": "
             "grouped matmuls over each expert's tokens. \"dense work\" counts all E experts, \"active\" the "
             "router + k experts a token uses.", "",
             "| model | experts | params | active | E / k | TFLOP/s active | MFU active | TFLOP/s dense work | "
             "MFU dense work |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in moe:
        lines.append(f"| {r['model']} | {r.get('experts_form', 'dense')} | {r['params'] / 1e6:,.1f}M | {r['active_params'] / 1e6:,.1f}M | "
                     f"{r['experts']} / {r['top_k']} | {r['model_tflops']:.1f} | {_pct(r['mfu'])} | "
                     f"{r['dense_work_tflops']:.1f} | {_pct(r['mfu_dense_work'])} |")
    return lines + [""]


def torch_lines(data: dict[str, Any]) -> list[str]:
    """The PyTorch reference's runs beside the JAX row of the same batch and layout."""
    ref = data.get("torch")
    if not ref:
        return []
    lines = ["## PyTorch reference (the same batch; `benchmarks/gpu/torch_learner.py`)", "",
             "| model | tokens/step | mode | attention | s/step | tokens/s | MFU | JAX same layout / torch |",
             "|---|---:|---|---|---:|---:|---:|---:|"]
    for run in ref["runs"]:
        packed = run.get("layout") == "packed"
        jax_row = next((r for r in data["learner"] if r["model"] == ref["model"] and r["pack"] == packed
                        and r["target_tokens"] == ref["target_tokens"]), None)
        ratio = "" if jax_row is None else f"{jax_row['tokens_per_s'] / run['tokens_per_s']:.2f}x"
        lines.append(f"| {ref['model']} | {ref['tokens_per_step']} | {run['mode']} | {run.get('attention', 'sdpa')} | "
                     f"{run['seconds']:.3f} | {run['tokens_per_s']:.0f} | {_pct(run.get('mfu'))} | {ratio} |")
    for failed in ref.get("failed", []):
        lines.append(f"| {ref['model']} | {ref['tokens_per_step']} | {failed['mode']} | not run: "
                     f"{failed['error'][:160]} | | | | |")
    if ref["runs"]:
        lines += ["", f"torch {ref['runs'][0]['torch']}: {ref['runs'][0]['matmul_precision']}."]
    return lines + [""]


def lever_lines(phases: dict[str, Any] | None) -> list[str]:
    """learner_phases: each phase, then each lever alone and the winner per phase."""
    if not phases:
        return []
    lines = [f"## Learner phases ({phases['model']}, one packed micro-batch of {phases['tokens']} tokens, "
             f"{phases['completion_tokens']} completion tokens)", "",
             "| phase / lever | ms | TFLOP/s | of matmul rate | note |", "|---|---:|---:|---:|---|"]
    groups = [("", phases.get("phases", {}))] + [(f"{kind} ", phases.get(f"{kind}_levers") or {})
                                                 for kind in ("head", "layer")]
    for prefix, entries in groups:
        for name, r in entries.items():
            note = r.get("error") or r.get("skipped") or ""
            ms = "" if "ms" not in r else f"{r['ms']:.2f}"
            tflops = "" if r.get("tflops") is None else f"{r['tflops']:.1f}"
            lines.append(f"| {prefix}{name} | {ms} | {tflops} | {_pct(r.get('fraction_of_matmul'))} | {note[:120]} |")
    for phase, won in (phases.get("winner") or {}).items():
        if won.get("lever"):
            lines.append(f"\nWinner, {phase}: `{won['lever']}` at {won['ms']:.2f} ms, "
                         f"{won['speedup_vs_baseline']:.2f}x the baseline's speed.")
    return lines + [""]


def invariance_lines(check: dict[str, Any] | None) -> list[str]:
    """batch_invariance: differing log-probs per dtype x flag x composition, and the sampler's cost."""
    if not check:
        return []
    lines = ["## Batch invariance (sampled log-probs that differ from the learner's pi_old)", "",
             "| dtype, flag | tokens | differing per composition |", "|---|---:|---|"]
    for key, r in check.get("exactness", {}).items():
        lines.append(f"| {key} | {r['tokens']} | {', '.join(f'{c}: {n}' for c, n in r['differing'].items())} |")
    cost = check.get("sampler_cost")
    if cost:
        lines += ["", f"Sampler cost ({cost['dtype']}, {cost['sequences']} x {cost['new_tokens']} tokens): "
                  f"{cost['tokens_per_s_on']:.0f} tokens/s with the flag on, {cost['tokens_per_s_off']:.0f} off "
                  f"(on / off {cost['on_over_off']:.2f})."]
    return lines + [""]
