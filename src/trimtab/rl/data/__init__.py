"""Market data: loading OHLCV files (:mod:`.load`), calendars and time zones (:mod:`.calendar`),
the checks and warnings on a user's data (:mod:`.checks`, :mod:`.issues`), the embedded
synthetic market (:mod:`.synthetic`) and the features the agent observes (:mod:`.features`)."""
