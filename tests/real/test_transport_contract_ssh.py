"""The transport contract (tests/fast/test_transport_contract.py, there by `local`) over `ssh`, against a
real sshd on loopback (tests/real/conftest.py: throwaway keys, pinned): the same tests, collected here."""

from __future__ import annotations

import pytest

from tests.fast.test_transport_contract import (  # noqa: F401 (the contract's tests and fixture, collected here)
    make_transport,
    test_a_command_past_its_timeout_is_stopped,
    test_a_reader_never_sees_a_partial_file_while_it_is_rewritten,
    test_a_spawned_process_and_its_children_are_stopped,
    test_a_write_cut_off_before_its_rename_leaves_the_old_content_and_no_temporary_file,
    test_arguments_are_never_interpreted_by_a_shell,
    test_processes_left_running_are_stopped_when_the_transport_closes,
    test_run_returns_output_and_refuses_a_non_zero_exit,
    test_write_file_replaces_content_whole_and_leaves_no_temporary_file,
)
from tests.support.sshd import SshHost


@pytest.fixture(params=["ssh"])
def transport_kind(request: pytest.FixtureRequest, sshd_host: SshHost) -> str:
    return str(request.param)
