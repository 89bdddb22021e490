"""Running: the one runner (:mod:`.runner`), walk-forward windows (:mod:`.walkforward`), collection
(:mod:`.collect`), evaluation (:mod:`.evaluate`), checkpoints and the run directory
(:mod:`.checkpoint`, :mod:`.rundir`), several processes (:mod:`.ddp`), memory checks
(:mod:`.memory`) and the ``train`` / ``report`` / ``eval`` / ``config`` commands (:mod:`.cli`)."""
