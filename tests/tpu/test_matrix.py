"""`make tpu-compile`'s bookkeeping: its jobs make every cell the results file asks for, and each cell
records its wall and CPU seconds (the compiles themselves are `test_compile_step`'s)."""
from __future__ import annotations

import json
import time

from jaxrl_llm.benchmarks.tpu import matrix


def test_jobs_make_every_cell_the_results_file_asks_for():
    # what `missing` lists for an empty file, by hand: a fitting step per model, two 1.5B variants
    # (made by Qwen2.5-1.5B's job), 10 decode cells ((3 slot + 2 compact layouts) x 2 batches), 3 learner cells
    wanted = matrix.missing({})
    assert len(wanted) == 4 + 2 + 10 + 3
    made = {job.key for job in matrix.JOBS if job.key} | {f"step:{job.model}" for job in matrix.JOBS if job.model}
    made |= {f"variant:{v}:qwen2.5-1.5b" for v in ("fp16", "batch_invariant")
             if any(job.model == "qwen2.5-1.5b" for job in matrix.JOBS)}
    assert set(wanted) == made and len(matrix.JOBS) == 4 + 13


def test_a_cell_records_its_wall_and_cpu_seconds_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "m.json"

    def fake_cell():  # 0.3 s of this process's CPU, then 0.4 s asleep
        start = time.process_time()
        while time.process_time() - start < 0.3:
            pass
        time.sleep(0.4)
        return {"fits": True}

    cell = matrix._record(out, None, "step:fake:v4-8", fake_cell)
    assert 0.25 <= cell["cpu_s"] <= 0.5 and 0.65 <= cell["wall_s"] <= 30 and len(cell["load_avg_at_end"]) == 3
    assert json.loads(out.read_text())["cells"]["step:fake:v4-8"] == cell
    assert matrix._record(out, None, "step:fake:v4-8", lambda: 1 / 0) == cell  # not made again
