"""Cost models and measurements: the roofline, the GPU catalogue, the planner and benchmarks."""
