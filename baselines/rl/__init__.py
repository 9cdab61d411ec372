"""The RL math the learners share: small tensor functions with shape comments, each unit-tested.

===============  ==============================================================================
policy_gradient  returns, group-relative advantages, the clipped PG loss, one agent's update
tree             tree-expanded multi-turn rollouts for MAGRPO and their per-node advantages (AT-GRPO)
experience       PPO's per-token training signal from played turns: rewards, values, GAE
critic           the centralised critic (a value head on its own LoRA adapter)
kl_control       the weight of PPO's KL penalty (adaptive or fixed)
preference       preference pairs and the DPO / reward-model losses of MADPO and MARLHF
preference_team  MADPO's and MARLHF's settings and team: candidates sampled, pairs gathered, resumed
tensors          masked means
===============  ==============================================================================
"""
