"""The agent: the distributional DQN and its config (:mod:`.dqn`), networks, losses, replay, the
learner that owns the guarded step (:mod:`.learner`), the stability wiring (:mod:`.stability`),
the sentinel's checks (:mod:`.checks`) and CUDA-graph capture (:mod:`.graphed`)."""
