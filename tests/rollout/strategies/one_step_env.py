"""A one-decision env for strategy tests: "down" wins, and no env response follows."""

from agentrl_jax.envs import base


class OneStep(base.TextEnv):
  """Ends after one step: one decision per episode, and nothing for a branch to follow."""

  action_words = ("left", "down", "right", "up")

  def __init__(self):
    super().__init__(max_turns=1)

  def expert_action(self):
    return "down"

  def _reset(self, seed):
    return f"map {seed}: go down"

  def _step(self, action):
    ok = base.parse_action(action, self.action_words) == "down"
    return base.StepResult("done", float(ok), True, {"action_valid": True, "success": ok})
