"""A simulated llama-server: the same HTTP API and log lines, a calibrated model of its loop inside.

It is a test aid and a way to try serve-tuner without a build (`engine.binary = "simulated"`), never a
replacement for the real server: the real-server tests stay, and `scripts/calibrate_sim.py` measures the
real one to fit the model's constants (docs/simulator.md shows both side by side).

- `tuner.sim.model`: the server's loop (slots, batches, micro-batches, LoRA, noise) on a clock of its
  own; no I/O. What it runs on (`inputs`: settings, costs, noise), its requests and slots (`slots`), the
  prompt caches (`prompt_cache`) and its log lines (`log_lines`) are modules of their own.
- `tuner.sim.server`: the HTTP front and the log, in real time divided by a speed factor; the
  `tuner-sim-llama-server` program, its command line (`command_line`) and its HTTP bodies (`api`).
- `tuner.sim.virtual`: a replay on the model's own clock, without sockets, for many studies in seconds.
"""
