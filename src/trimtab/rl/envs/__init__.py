"""Environments: the batched trading env (:mod:`.trading`), the adapters that give the runner one
face over the market, Gymnasium and the torch CartPole (:mod:`.adapters`), the batched torch
CartPole (:mod:`.cartpole`), and env state saved as plain data (:mod:`.gym_state`)."""
