"""Honest backtests: how a decision is filled and charged (:mod:`.execution`), performance
statistics over the whole out-of-sample curve with intervals (:mod:`.stats`), the simple
strategies every agent is compared with on the same days, costs and fills (:mod:`.baselines`)
and the pooled out-of-sample evaluation of a walk-forward run (:mod:`.pooled`)."""
