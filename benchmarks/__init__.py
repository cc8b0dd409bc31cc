"""Scripts that measure speed (allreduce bandwidth, training throughput, scaling). Not tests:
each prints a table and writes JSON and a PNG; see BENCHMARKS.md."""
