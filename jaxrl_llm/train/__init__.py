"""jaxrl_llm.train: the RL run, in rooms by stage.

  config/   the run's schema and the checks every Config runs (imports nothing else of train)
  plan.py   the run planner: Config (+ task) -> RunPlan, derived once and passed down
  policy.py, distributed.py   the policy (weights, tokenizer, template) and the JAX processes / mesh,
            which both stages use
  sample/   the sampling stage: prompts, engines, sampling modes, grading, shaping, async producer
  learn/    the learning stage: learner arrays, packing, the Learner, pi_old, the optimiser step
  run/      the loop that joins them: train(), checkpoints, metrics, evaluation, the teacher

The sampling stage never imports the learning stage, and config never imports the planner
(tests/structure/test_import_graph.py).
"""
