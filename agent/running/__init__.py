"""The runner's half of the job protocol: admit, start, stop, fence, drain, report."""
