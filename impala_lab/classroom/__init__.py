"""What the course uses beside the pipeline: exercises and their checker, the course files,
the paper's off-policy study and the synchronous loop that IMPALA is compared with."""
