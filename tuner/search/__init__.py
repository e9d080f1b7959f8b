"""The search: a study prepared and checked (`prepare`), Optuna's samplers (`samplers`), the ask/tell loop
(`loop`) with its gates and confirmation, the one place a trial ends (`ending`), read-only queries over the
trials (`queries`), the peers protocol for a single host and a fleet (`peers`, `fleet_peers`), and the
command's entry (`entry`). docs/architecture.md maps them."""

from typing import TYPE_CHECKING

from tuner.lazy import lazy_exports

if TYPE_CHECKING:
    from tuner.search.ending import record_constraints
    from tuner.search.entry import budget_for_trials, fleet_hosts, fleet_loops, run_fleet, run_search, run_study
    from tuner.search.fleet_peers import HOST_CHECK_AFTER_FAILURES, FleetHost, FleetPeers
    from tuner.search.loop import StudyRun
    from tuner.search.peers import Peers, Pending, SoloPeers
    from tuner.search.prepare import check_host_files, check_simulated_server, host_has_file, prepare_study
    from tuner.search.queries import over_budget
    from tuner.search.samplers import open_optuna_study
    from tuner.trial_runner import PreparedStudy

# Imported on first use: the loop's modules import this package, and must not load the entry's fleet code
# and deployers with it (tests/fast/test_package.py).
_EXPORTS = {
    "record_constraints": "tuner.search.ending",
    "budget_for_trials": "tuner.search.entry",
    "fleet_hosts": "tuner.search.entry",
    "fleet_loops": "tuner.search.entry",
    "run_fleet": "tuner.search.entry",
    "run_search": "tuner.search.entry",
    "run_study": "tuner.search.entry",
    "HOST_CHECK_AFTER_FAILURES": "tuner.search.fleet_peers",
    "FleetHost": "tuner.search.fleet_peers",
    "FleetPeers": "tuner.search.fleet_peers",
    "StudyRun": "tuner.search.loop",
    "Peers": "tuner.search.peers",
    "Pending": "tuner.search.peers",
    "SoloPeers": "tuner.search.peers",
    "check_host_files": "tuner.search.prepare",
    "check_simulated_server": "tuner.search.prepare",
    "host_has_file": "tuner.search.prepare",
    "prepare_study": "tuner.search.prepare",
    "over_budget": "tuner.search.queries",
    "open_optuna_study": "tuner.search.samplers",
    "PreparedStudy": "tuner.trial_runner",
}


__getattr__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "FleetHost",
    "FleetPeers",
    "HOST_CHECK_AFTER_FAILURES",
    "Peers",
    "Pending",
    "PreparedStudy",
    "SoloPeers",
    "StudyRun",
    "budget_for_trials",
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
