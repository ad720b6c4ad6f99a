"""reports/runs.py's seed loop (`run_seeded_experiment`) and summary row (`interval_row`), on a
trivial trainer: it writes the run's config and one real (orbax) checkpoint, and records each
call, so keeping finished runs and resuming part-trained ones goes through `train_or_resume`
as in an experiment, without a model."""
import functools
import math

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxrl_llm.reports.runs import experiment_parser, interval_row, run_seeded_experiment, train_or_resume
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.config import config_from_dict
from jaxrl_llm.train.run.provenance import write_run_info

VARIANTS = ("plain", "shaped")


def make_config(variant: str, seed: int):
    return config_from_dict({"name": f"t_{variant}", "seed": seed, "total_steps": 4, "model": {"source": "tiny"},
                             "checkpoint": {"every_steps": 1, "keep": 1, "async_save": False},
                             "train": {"lr": 1e-3 if variant == "plain" else 2e-3}})


class TrivialTrainer:
    """Records (run, resume, policy, compile cache dir) and saves a checkpoint at step `stop_at`
    (default: total_steps, a finished run)."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at or {}

    def __call__(self, cfg, *, resume, policy):
        self.calls.append((cfg.run_path.name, resume, policy, jax.config.jax_compilation_cache_dir))
        write_run_info(cfg.run_path, cfg)
        with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=1, async_save=False) as ckpt:
            ckpt.save(self.stop_at.get(cfg.run_path.name, cfg.total_steps), {"w": np.zeros(2)}, force=True)


def run(out, argv, trainer, loads):
    args = experiment_parser("t", name="t", seeds=((0, 1, 2), (0,))).parse_args(argv)
    return run_seeded_experiment(args, out, VARIANTS, make_config, ("total_steps=2",),
                                 train=functools.partial(train_or_resume, trainer=trainer),
                                 load_policy=lambda source: loads.append(source) or f"policy<{source}>")


def test_runs_every_variant_seed_by_seed_then_keeps_finished_and_resumes_cut_runs(tmp_path):
    cache_before = jax.config.jax_compilation_cache_dir
    loads, first = [], TrivialTrainer(stop_at={"shaped_s0": 1})  # shaped_s0 stops after step 1 of 4
    done = run(tmp_path, ["--seeds", "2,0", "train.grad_clip=0.5"], first, loads)
    order = ["plain_s2", "shaped_s2", "plain_s0", "shaped_s0"]  # the seeds in the order given, variants within
    assert [c[0] for c in first.calls] == order and list(done.runs) == [("plain", 2), ("shaped", 2),
                                                                         ("plain", 0), ("shaped", 0)]
    assert done.seeds == (2, 0) and done.variants == VARIANTS
    assert loads == ["tiny"] and {c[2] for c in first.calls} == {"policy<tiny>"}  # one policy, shared
    assert {c[1] for c in first.calls} == {False}
    assert {c[3] for c in first.calls} == {str(tmp_path / "jax_cache")} and jax.config.jax_compilation_cache_dir \
        == cache_before  # the cache is set during the runs only
    for (variant, seed), cfg in done.configs.items():
        assert done.runs[(variant, seed)] == tmp_path / f"{variant}_s{seed}" == cfg.run_path
        assert (cfg.seed, cfg.train.lr, cfg.train.grad_clip, cfg.total_steps) == \
            (seed, make_config(variant, seed).train.lr, 0.5, 4)  # user override on, --quick's off

    again = TrivialTrainer()
    run(tmp_path, ["--seeds", "2,0", "train.grad_clip=0.5"], again, loads)
    assert [(c[0], c[1]) for c in again.calls] == [("shaped_s0", True)]  # finished kept, the cut one resumed

    quick = TrivialTrainer()
    done = run(tmp_path / "q", ["--quick"], quick, loads)
    assert [c[0] for c in quick.calls] == ["plain_s0", "shaped_s0"]  # --quick seeds, --quick overrides
    assert {cfg.total_steps for cfg in done.configs.values()} == {2}


def test_a_finished_run_without_checkpoints_is_kept_and_a_cut_one_retrained(tmp_path):
    """Deleting a finished run's checkpoints (1.4 GB each for SmolLM2) must not make a rerun of
    the experiment train it again and overwrite its logs; a run cut before its first checkpoint
    is still redone from scratch."""
    import json
    import shutil

    run(tmp_path, ["--seeds", "0"], TrivialTrainer(), [])
    for variant, last in (("plain", 4), ("shaped", 2)):  # total_steps = 4
        lines = "".join(json.dumps({"step": step, "reward": 0.5}) + "\n" for step in range(1, last + 1))
        (tmp_path / f"{variant}_s0" / "metrics.jsonl").write_text(lines)
        shutil.rmtree(tmp_path / f"{variant}_s0" / "checkpoints")
    again = TrivialTrainer()
    run(tmp_path, ["--seeds", "0"], again, [])
    assert [(c[0], c[1]) for c in again.calls] == [("shaped_s0", False)]
    assert (tmp_path / "plain_s0" / "metrics.jsonl").read_text().count("\n") == 4  # kept as it was
    assert not (tmp_path / "shaped_s0" / "metrics.jsonl").exists()  # the cut run's lines are redone


def test_per_variant_reads_each_run_in_seed_order(tmp_path):
    done = run(tmp_path, ["--seeds", "1,0,2"], TrivialTrainer(), [])
    assert done.per_variant(lambda path: path.name) == {"plain": ["plain_s1", "plain_s0", "plain_s2"],
                                                        "shaped": ["shaped_s1", "shaped_s0", "shaped_s2"]}


def test_interval_row_holds_mean_t_interval_and_per_seed_values():
    per_seed = {3: {"a": 1.0, "b": 2.0}, 5: {"a": 2.0, "b": 4.0}, 8: {"a": 6.0, "b": float("nan")}}
    row = interval_row({"variant": "x", "seeds": 3}, per_seed, ("a", "b"), signed=lambda key: key == "b")
    half = scipy_stats.t.ppf(0.975, 2) * np.std([1, 2, 6], ddof=1) / math.sqrt(3)  # 4.303 * 2.646 / 1.732
    assert row["a interval"] == pytest.approx({"mean": 3.0, "low": 3.0 - half, "high": 3.0 + half, "n": 3})
    assert row["a"] == f"3 [{3 - half:.3g}, {3 + half:.3g}] (n = 3)"
    b_half = 12.706205 * math.sqrt(2) / math.sqrt(2)  # 2 finite seeds: t_{0.975, 1} * s / sqrt(2), s = sqrt(2)
    assert row["b interval"] == pytest.approx({"mean": 3.0, "low": 3.0 - b_half, "high": 3.0 + b_half, "n": 2})
    assert row["b"].startswith("+3 [") and row["a"].startswith("3 [")  # signed only where asked
    assert row["per seed"] == per_seed and (row["variant"], row["seeds"]) == ("x", 3)


def test_a_summary_names_the_commit_read_at_the_start_not_the_head_at_the_end(tmp_path, monkeypatch, request):
    """An experiment that runs for an hour while commits land names the code that ran: the
    commit `experiment_parser` read at its start (reports.results.code_version)."""
    import json

    from jaxrl_llm.reports import results, runs

    results.code_version.cache_clear()
    request.addfinalizer(results.code_version.cache_clear)  # later tests read the real commit, pass or fail
    monkeypatch.setattr(results, "git_commit", lambda *a, **k: "a" * 40)
    monkeypatch.setattr(results, "git_dirty", lambda *a, **k: False)
    experiment_parser("doc", name="x")  # the start: reads the commit once
    monkeypatch.setattr(results, "git_commit", lambda *a, **k: "b" * 40)  # HEAD moved during the run
    import jaxrl_llm.train.run.provenance as provenance
    monkeypatch.setattr(provenance, "git_commit", lambda *a, **k: "b" * 40)
    runs.write_summary(tmp_path, [{"a": 1}], ["a"], title="t")
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["git_commit"] == "a" * 40 and info["git_dirty"] is False
