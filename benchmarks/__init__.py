"""dl2's benchmarks (not tests): ``python -m benchmarks [SUITE ...] [--quick]``."""
