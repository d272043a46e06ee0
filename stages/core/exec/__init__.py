"""Running model-written code: OS isolation, the Python sandbox, the benchmark grader process."""
