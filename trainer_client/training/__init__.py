"""The single-process GRPO trainer (CPU or one GPU), with veRL's own losses.

* ``grpo``: ``GRPOTrainer``, rollouts against the tool server, advantages, the update;
* ``config``: ``GRPOConfig``, every knob (the ``train`` flags come from it);
* ``logprobs``: per-token log-probs of responses, with gradients;
* ``checkpoints``: the model in HF format plus the trainer's state, written atomically;
* ``curriculum``: which task levels a step's prompts are drawn from;
* ``step_metrics``: a step's rollout time by phase and its reward per problem kind;
* ``sft``, ``sft_config``, ``sft_data``: the supervised warm start (``trainer-client sft``): gold or
  successful trajectories, rendered and masked by the rollout core, trained on their model tokens.

Nothing is imported here: ``grpo`` and ``logprobs`` need torch. ``trainer_client`` exports
``GRPOTrainer`` and ``GRPOConfig`` on first use.
"""
