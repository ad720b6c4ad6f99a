"""A scripted policy as a rollout engine, for the environment tests (a real model would not
follow a script): the reply's text goes through the real tokenizer, and the loop decodes it,
steps the environment and renders the observation with the real chat template."""
from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord

FAKE_LOGPROB = -0.25  # the scripted policy's "log-prob" of each token it emits


class FakeScriptedEngine:
    """`script(history_text) -> reply text`; the reply is tokenised and closed with EOS."""

    weight_version = 0

    def __init__(self, policy, script):
        self.policy, self.script, self.calls = policy, script, []

    def generate(self, prompts, n, params):
        self.calls.append(len(prompts))
        eos = self.policy.eos_token_ids[0]
        records = []
        for i, prompt in enumerate(prompts):
            history = self.policy.tokenizer.decode(list(prompt), skip_special_tokens=False)
            ids = self.policy.tokenizer.encode(self.script(history), add_special_tokens=False).ids + [eos]
            finish = "stop" if len(ids) <= params.max_tokens else "length"
            ids = ids[:params.max_tokens]
            records.append(RolloutRecord(i, 0, prompt, ids, [FAKE_LOGPROB] * len(ids), finish, 0))
        return RolloutBatch(records, len(prompts), 1)
