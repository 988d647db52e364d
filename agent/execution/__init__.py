"""Running a job's processes: launching, containment, the job user, pinning, logs, progress."""
