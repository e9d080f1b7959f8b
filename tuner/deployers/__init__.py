"""Deployers apply a `LaunchSpec` on a host, restart the server, wait until it is healthy, hand over
its log, and restore exactly what they found. A deployer never sees an engine.
"""

from __future__ import annotations

from tuner.deployers.base import DEPLOYERS, Deployer, Deployment, create_deployer, wait_until_healthy
from tuner.deployers.container import ContainerDeployer
from tuner.deployers.process import ProcessDeployer
from tuner.deployers.systemd import SystemdDeployer

__all__ = [
    "DEPLOYERS",
    "ContainerDeployer",
    "Deployer",
    "Deployment",
    "ProcessDeployer",
    "SystemdDeployer",
    "create_deployer",
    "wait_until_healthy",
]
