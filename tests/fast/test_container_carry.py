"""What a trial container carries of the operator's container that no runtime here can show (no GPU, no
Docker engine): docker's `--gpus` of every form, podman's CDI names, AMD's devices, an unlimited memlock; and
what is refused by name. The rest is compared field by field on real podman
(tests/real/test_container_deployer_real.py)."""

from __future__ import annotations

import itertools

from tuner.deployers.container.carry import trial_run_argv, uncarried_fields
from tuner.models import LaunchSpec


def test_a_trial_carries_gpus_of_any_form_and_refuses_what_it_cannot_carry() -> None:
    """What no container runtime here can show (no GPU): docker's `--gpus` of every form, podman's CDI names
    (kept only in its CreateCommand), AMD's devices; a device request of another driver refused by name."""
    docker = {
        "Name": "/vllm",
        "Config": {"Image": "vllm/vllm-openai:v0.33.0", "Entrypoint": ["vllm", "serve"]},
        "HostConfig": {
            "NetworkMode": "host",
            "DeviceRequests": [
                {"Driver": "", "Count": 2, "Capabilities": [["gpu"]]},
                {"Driver": "nvidia", "Count": 0, "DeviceIDs": ["0", "3"], "Capabilities": [["gpu"]]},
                {"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]},
            ],
            "Devices": [{"PathOnHost": "/dev/kfd", "PathInContainer": "/dev/kfd", "CgroupPermissions": "rwm"}],
            "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}],
        },
    }
    vllm = LaunchSpec(executable="vllm", args=("serve", "m"), port=8000)
    argv = trial_run_argv("docker", "vllm-tuner-trial", docker, vllm, env_file="F", original_ran=True)
    pairs = list(itertools.pairwise(argv))
    for pair in (("--gpus", "2"), ("--gpus", '"device=0,3"'), ("--gpus", "all"), ("--device", "/dev/kfd")):
        assert pair in pairs, pair
    assert ("--ulimit", "memlock=-1:-1") in pairs
    assert uncarried_fields(docker, "docker") == []
    podman = {
        "Name": "/vllm",
        "OCIRuntime": "crun",
        "Config": {
            "Image": "img",
            "CreateCommand": ["podman", "run", "--device", "nvidia.com/gpu=all", "--device=/dev/dri", "img"],
        },
        "HostConfig": {"NetworkMode": "host", "Devices": [{"PathOnHost": "/dev/dri", "PathInContainer": "/dev/dri"}]},
    }
    argv = trial_run_argv("podman", "vllm-tuner-trial", podman, vllm, env_file="F", original_ran=True)
    pairs = list(itertools.pairwise(argv))
    assert ("--device", "nvidia.com/gpu=all") in pairs and ("--device", "/dev/dri") in pairs
    assert argv[:3] == ["podman", "--runtime", "crun"]
    other = {"HostConfig": {"DeviceRequests": [{"Driver": "amd", "Count": 1, "Capabilities": [["gpu"]]}]}}
    assert uncarried_fields(other, "docker") == ["HostConfig.DeviceRequests (driver 'amd', ['gpu'])"]
    legacy = {"HostConfig": {"Links": ["/db:/vllm/db"], "BlkioWeight": 300, "NetworkMode": "host"}}
    assert uncarried_fields(legacy, "docker") == ["HostConfig.BlkioWeight", "HostConfig.Links"]
