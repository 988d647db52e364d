"""The scheduling benchmark: a trace-driven simulator of the mesh and the policies it compares
(``python -m bench.sched``, see :mod:`bench.sched.cli`)."""
