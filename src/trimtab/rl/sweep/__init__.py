"""Sweeps: a sweep's trials on Ray (:mod:`.trials`), the sweep file (:mod:`.spec`), the merged
table (:mod:`.table`) and the ``sweep`` command (:mod:`.cli`)."""
