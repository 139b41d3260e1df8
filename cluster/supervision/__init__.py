"""A job and its processes, kept alive: pure decisions (:mod:`.core`), host watch streams
(:mod:`.links`), the executor that acts on the decisions (:mod:`.executor`), the two job kinds
(:mod:`.train_job`: ``pscluster train``; :mod:`.program_job`: ``pscluster run``) with the
train job's options and argv (:mod:`.training`), the job record (:mod:`.jobrecord`), stopping a job
with its checkpoint (:mod:`.jobstop`), and the daemon that supervises a ``--detach`` job
(:mod:`.daemon`).

This file imports nothing: the job record is read by the state file and the events
(cluster/state.py, cluster/events.py), which must not import the supervisor with it
(tests/unit/test_house.py holds that)."""
