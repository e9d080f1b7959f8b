"""The search: a study prepared and checked (`prepare`), Optuna's samplers (`samplers`), the ask/tell loop
(`loop`) with its gates and confirmation, the one place a trial ends (`ending`), read-only queries over the
trials (`queries`), the peers protocol for a single host and a fleet (`peers`, `fleet_peers`), and the
command's entry (`entry`). docs/architecture.md maps them."""

from tuner.search.ending import record_constraints
from tuner.search.entry import fleet_hosts, fleet_loops, run_fleet, run_search, run_study
from tuner.search.fleet_peers import HOST_CHECK_AFTER_FAILURES, FleetHost, FleetPeers
from tuner.search.loop import StudyRun
from tuner.search.peers import Peers, Pending, SoloPeers
from tuner.search.prepare import check_host_files, check_simulated_server, host_has_file, prepare_study
from tuner.search.queries import over_budget
from tuner.search.samplers import open_optuna_study
from tuner.trial_runner import PreparedStudy

__all__ = [
    "FleetHost",
    "FleetPeers",
    "HOST_CHECK_AFTER_FAILURES",
    "Peers",
    "Pending",
    "PreparedStudy",
    "SoloPeers",
    "StudyRun",
    "check_host_files",
    "check_simulated_server",
    "fleet_hosts",
    "fleet_loops",
    "host_has_file",
    "open_optuna_study",
    "over_budget",
    "prepare_study",
    "record_constraints",
    "run_fleet",
    "run_search",
    "run_study",
]
