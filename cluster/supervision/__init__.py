"""Supervision of a job's processes: pure decisions (:mod:`.core`), host watch streams
(:mod:`.links`) and the executor that acts on the decisions (:mod:`.executor`)."""
