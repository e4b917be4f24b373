"""Runs around the library: the command line, the figures of README.md and the benchmarks.
Nothing in the package imports these."""
