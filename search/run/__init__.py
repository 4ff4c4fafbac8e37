"""A search job's life: resolving and checking the job, the coordinator that joins an optimizer to the worker
pool, the run directory's files and their checks, the heartbeat and `status`. Reports progress to a reporter
object; it never draws on a terminal itself."""
