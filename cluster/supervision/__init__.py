"""A job and its processes, kept alive: pure decisions (:mod:`.core`), host watch streams
(:mod:`.links`), the executor that acts on the decisions (:mod:`.executor`), the two job kinds
(:mod:`.train_job`: ``pscluster train``; :mod:`.program_job`: ``pscluster run``) with the
train job's options and argv (:mod:`.training`), stopping a job with its checkpoint
(:mod:`.jobstop`), and the daemon that supervises a ``--detach`` job (:mod:`.daemon`). The job
record they write is cluster/jobrecord.py, the supervisor's liveness cluster/liveness.py."""
