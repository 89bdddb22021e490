"""The run report: ``report.html`` and its plots (:mod:`.build`, :mod:`.plots`) and tables
(:mod:`.tables`)."""
