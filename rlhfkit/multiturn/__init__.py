"""Multi-turn rollouts for online RL: the policy calls tools and plays against environments.

- ``tools``: Python functions as tools (schemas, parsing calls from replies, running them with a timeout)
- ``envs``: the environment protocol (``reset(row)``, ``step(reply)``)
- ``template``: the token-exact splice of tool and environment messages after the model's sampled tokens
- ``rollout``: ``MultiTurn.rollout``, which plays a batch of conversations turn by turn

The trainer (``rlhfkit.trainers.online``) trains on the policy's own tokens only; the spliced ones are context.
"""
