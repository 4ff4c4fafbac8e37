"""A search run: the run directory's files and their checks, the replay that resumes a run from its history, the
heartbeat, and the coordinator that joins an optimizer to the workers. Reports progress to a reporter object; it
never draws on a terminal itself."""
