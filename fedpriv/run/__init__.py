"""Layer 4: one run: the plan, the client algorithm and strategy interfaces, the engine (workers,
messages, aggregators), the job, checkpoints, the Ray session and the runner."""
