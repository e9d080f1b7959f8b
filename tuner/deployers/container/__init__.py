"""The `container` deployer (docker or podman): each trial runs as a copy of the operator's server
container with the trial's command line, beside the original, which is stopped and never changed.

    apply:   inspect NAME (the original, once; refused here, before anything stops, if a trial could not
             be a faithful copy of it: carry.py, ownership.py, or the tuner could not reach its server)
             arm the watcher on the host (dead_man.py)
             stop NAME                                      (while it runs)
             rm -f NAME-tuner-trial; run -d --name NAME-tuner-trial <everything of NAME but its command
             line and environment> --env-file F <the launch>        (env_file.py: F is 0600, removed at once)
    restore: rm -f NAME-tuner-trial; start NAME (if it ran); wait for its health; disarm the watcher;
             compare NAME's inspect with the one taken first (all but its state)

The original keeps its name throughout: `docker ps -a` shows it stopped beside the trial, and an engine or
host restart finds it where the operator left it. A run that finds NAME-tuner-trial (a controller killed
mid-study) removes it and starts the original first, as the watcher would have.

The trial's argv is the engine's launch: where the image's entrypoint already is its start (vLLM's image
runs `vllm serve`), only the rest is passed, as the image expects; otherwise `--entrypoint` replaces it.
"""

from __future__ import annotations

from tuner.deployers.container.carry import trial_run_argv
from tuner.deployers.container.deployer import ContainerDeployer, ContainerOptions
from tuner.deployers.container.env_file import trial_env_file

__all__ = ["ContainerDeployer", "ContainerOptions", "trial_env_file", "trial_run_argv"]
