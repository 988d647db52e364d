"""Local meshes of real agents for the demo, the tests and the benchmarks; the synthetic job."""
