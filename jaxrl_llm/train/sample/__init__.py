"""The sampling stage of an RL step: prompts, rollout engines, the sampling modes (plain, dynamic
rounds, multi-turn episodes, VinePPO continuations), grading, reward shaping, and the asynchronous
producer that samples ahead. Never imports train.learn."""
