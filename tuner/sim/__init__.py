"""A simulated llama-server: the same HTTP API and log lines, a calibrated model of its loop inside.

It is a test aid and a way to try serve-tuner without a build (`engine.binary = "simulated"`), never a
replacement for the real server: the real-server tests stay, and `scripts/calibrate_sim.py` measures the
real one to fit the model's constants (docs/simulator.md shows both side by side).

- `tuner.sim.model`: the server's loop (slots, batches, micro-batches, prompt cache, LoRA, noise) on a
  clock of its own; no I/O.
- `tuner.sim.server`: the HTTP front and the log, in real time divided by a speed factor; the
  `tuner-sim-llama-server` program.
- `tuner.sim.virtual`: a replay on the model's own clock, without sockets, for many studies in seconds.
"""
