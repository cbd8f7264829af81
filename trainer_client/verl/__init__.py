"""veRL plug-ins: the AgentLoop that runs our rollout core with veRL's server manager as the
generator, the reward bridge, and their settings.

* ``agent_loop``: the AgentLoop (registered as ``toolfactory`` through the ``verl.plugins``
  entry point);
* ``reward_bridge``: ``compute_score`` for ``reward.custom_reward_function``, scored by the
  server's ``/v1/verify``;
* ``config``: the agent loop's settings, its YAML, and ``trainer-client verl-config``;
* ``sft_dataset``: ``TokenSFTDataset``, veRL's SFT trainer on ``trainer-client sft --export verl-parquet``
  data, token-exact (``data.custom_cls``).

Nothing is imported here: ``agent_loop`` imports veRL, which takes seconds.
"""
