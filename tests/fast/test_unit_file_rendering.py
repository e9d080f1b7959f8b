"""The systemd deployer's unit-file text, without a host: what our drop-in and secrets file say, how a
value is quoted so systemd reads back exactly it, and how `systemctl show` output is read back.

These are the pure functions of `tuner/deployers/systemd/unit_file.py`; the deployer's tests against a real
systemd (tests/real/test_systemd_deployer.py) check that systemd reads this text as meant. Here each rule
is pinned on its own, so that scripts/mutmut.sh can tell which one a change broke.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from tuner.deployers.systemd import (
    check_kept_command,
    parse_show_environment,
    quote_unit_word,
    render_drop_in,
    render_secrets_file,
)
from tuner.errors import ConfigError
from tuner.models import LaunchSpec


def _launch(
    *,
    executable: str = "/usr/bin/llama-server",
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        executable=executable,
        args=args,
        env=env or {},
        secret_env={name: SecretStr(value) for name, value in (secrets or {}).items()},
        port=8080,
    )


# ---- quote_unit_word ---------------------------------------------------------------------------


def test_a_plain_word_is_only_put_in_double_quotes() -> None:
    assert quote_unit_word("LLAMA_ARG_BATCH=512", in_exec=False, what="x") == '"LLAMA_ARG_BATCH=512"'


def test_backslash_quote_and_percent_are_escaped_everywhere_and_dollar_only_in_exec_lines() -> None:
    assert quote_unit_word('a\\b"c%d$e', in_exec=False, what="x") == '"a\\\\b\\"c%%d$e"'
    assert quote_unit_word('a\\b"c%d$e', in_exec=True, what="x") == '"a\\\\b\\"c%%d$$e"'


def test_a_backslash_is_escaped_before_the_quote_so_an_escaped_quote_stays_one() -> None:
    # Escaping the quote first and then every backslash would turn \" into \\\" (a literal backslash,
    # then a quote that ends the word early).
    assert quote_unit_word('\\"', in_exec=False, what="x") == '"\\\\\\""'


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\0", "\x1b", "\x1f", "\x7f"])
def test_a_control_character_is_refused_naming_what_carried_it(char: str) -> None:
    with pytest.raises(ConfigError) as refused:
        quote_unit_word(f"a{char}b", in_exec=True, what="a command-line argument")
    assert str(refused.value) == (
        f"a command-line argument contains the control character {char!r}, which a unit file cannot carry; remove it"
    )


@pytest.mark.parametrize("char", [" ", "~", "\x80", "é", "\u2028"])
def test_printable_and_non_ascii_characters_are_carried(char: str) -> None:
    # 0x20 (space) and 0x7e are the ends of the printable ASCII range; 0x80 and above are not controls
    # in a unit file (systemd reads it as UTF-8).
    assert quote_unit_word(f"a{char}b", in_exec=False, what="x") == f'"a{char}b"'


def test_text_that_is_not_utf8_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"^a command-line argument is not valid UTF-8; remove the stray bytes$"):
        quote_unit_word("model-\udcff.gguf", in_exec=True, what="a command-line argument")


# ---- render_drop_in ----------------------------------------------------------------------------


def test_keep_mode_writes_the_note_the_section_and_one_environment_line_per_variable() -> None:
    launch = _launch(env={"LLAMA_ARG_BATCH": "512", "LLAMA_ARG_UBATCH": "128"}, args=("--lora-scaled", "a:0"))
    text = render_drop_in(launch, exec_start="keep", note="serve-tuner trial 3")
    assert text == (
        '# serve-tuner trial 3\n[Service]\nEnvironment="LLAMA_ARG_BATCH=512"\nEnvironment="LLAMA_ARG_UBATCH=128"\n'
    )


def test_an_environment_value_is_quoted_with_dollar_left_alone() -> None:
    # Environment= does not expand $VAR, so doubling it would change the value the server gets.
    text = render_drop_in(_launch(env={"PROMPT": 'say "hi" at 100% for $5'}), exec_start="keep", note="n")
    assert 'Environment="PROMPT=say \\"hi\\" at 100%% for $5"\n' in text


def test_replace_mode_resets_exec_start_and_writes_the_whole_command_line() -> None:
    launch = _launch(env={"LLAMA_ARG_THREADS": "2"}, args=("--lora-scaled", "/srv/a b.gguf:0", "--alias", "$x"))
    text = render_drop_in(launch, exec_start="replace", note="n")
    assert text == (
        "# n\n"
        "[Service]\n"
        'Environment="LLAMA_ARG_THREADS=2"\n'
        "ExecStart=\n"
        'ExecStart="/usr/bin/llama-server" "--lora-scaled" "/srv/a b.gguf:0" "--alias" "$$x"\n'
    )


def test_secrets_are_referenced_by_file_never_written_into_the_drop_in() -> None:
    launch = _launch(env={"LLAMA_ARG_THREADS": "2"}, secrets={"LLAMA_API_KEY": "sk-canary-123"})
    text = render_drop_in(launch, exec_start="keep", note="n", secrets_file="/run/serve-tuner/secrets.env")
    assert "sk-canary-123" not in text
    assert text.endswith('Environment="LLAMA_ARG_THREADS=2"\nEnvironmentFile=/run/serve-tuner/secrets.env\n')


def test_without_secrets_no_environment_file_line_is_written() -> None:
    text = render_drop_in(_launch(env={"A": "1"}), exec_start="keep", note="n", secrets_file="/run/s.env")
    assert "EnvironmentFile" not in text


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "A=B", "", "A\nB"])
def test_an_environment_name_systemd_cannot_carry_is_refused(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        render_drop_in(_launch(env={name: "1"}), exec_start="keep", note="n")
    assert str(refused.value) == (f"environment variable name {name!r} is not valid; use letters, digits and _")


@pytest.mark.parametrize("name", ["_", "A", "a_1", "LLAMA_ARG_N_GPU_LAYERS"])
def test_valid_environment_names_are_accepted(name: str) -> None:
    assert f'Environment="{name}=1"' in render_drop_in(_launch(env={name: "1"}), exec_start="keep", note="n")


def test_a_control_character_in_a_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^the value of LLAMA_ARG_ALIAS contains the control character '\\n'"):
        render_drop_in(_launch(env={"LLAMA_ARG_ALIAS": "a\nb"}), exec_start="keep", note="n")


def test_a_control_character_in_an_argument_is_refused_in_replace_mode() -> None:
    with pytest.raises(ConfigError, match=r"^a command-line argument contains the control character"):
        render_drop_in(_launch(args=("--alias", "a\rb")), exec_start="replace", note="n")


def test_replace_mode_refuses_a_relative_executable_with_the_fix() -> None:
    with pytest.raises(ConfigError) as refused:
        render_drop_in(_launch(executable="llama-server"), exec_start="replace", note="n")
    assert str(refused.value) == (
        "ExecStart= needs the server program's absolute path on the host, not 'llama-server'; set engine.binary "
        "(vLLM: the first word of engine.command) to it"
    )


def test_keep_mode_does_not_need_an_absolute_executable() -> None:
    assert "ExecStart" not in render_drop_in(_launch(executable="llama-server"), exec_start="keep", note="n")


# ---- render_secrets_file -----------------------------------------------------------------------


def test_the_secrets_file_has_one_quoted_assignment_per_secret() -> None:
    launch = _launch(secrets={"LLAMA_API_KEY": "sk-1", "HF_TOKEN": "hf_2"})
    assert render_secrets_file(launch) == 'LLAMA_API_KEY="sk-1"\nHF_TOKEN="hf_2"\n'


def test_a_secret_is_escaped_so_systemd_reads_back_exactly_it() -> None:
    # EnvironmentFile= undoes a backslash before " \ ` $ inside double quotes, and only there.
    launch = _launch(secrets={"KEY": "a\"b\\c`d$e%f'gX"})
    assert render_secrets_file(launch) == 'KEY="a\\"b\\\\c\\`d\\$e%f\'gX"\n'


def test_a_launch_without_secrets_has_an_empty_secrets_file() -> None:
    assert render_secrets_file(_launch(env={"A": "1"})) == ""


def test_a_secret_with_a_control_character_is_refused_naming_the_variable_not_the_value() -> None:
    with pytest.raises(ConfigError) as refused:
        render_secrets_file(_launch(secrets={"LLAMA_API_KEY": "sk-\n-secret"}))
    message = str(refused.value)
    assert message.startswith("the value of LLAMA_API_KEY contains the control character '\\n'")
    assert "secret" not in message.replace("LLAMA_API_KEY", "")


def test_a_secret_under_a_bad_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable name 'API-KEY' is not valid"):
        render_secrets_file(_launch(secrets={"API-KEY": "x"}))


# ---- check_kept_command ------------------------------------------------------------------------

SHOWN = "{ path=/usr/bin/llama-server ; argv[]=/usr/bin/llama-server -m m.gguf --lora-scaled a.gguf:0 serve ; pid=0 }"


def test_arguments_the_units_command_passes_in_order_are_accepted() -> None:
    check_kept_command(_launch(args=("-m", "m.gguf")), SHOWN)
    check_kept_command(_launch(args=("--lora-scaled", "a.gguf:0")), SHOWN)
    check_kept_command(_launch(args=("-m", "serve")), SHOWN)  # not adjacent, but in order
    check_kept_command(_launch(), SHOWN)


def test_arguments_out_of_order_are_refused() -> None:
    with pytest.raises(ConfigError, match=r'set deploy\.exec_start = "replace"'):
        check_kept_command(_launch(args=("serve", "-m")), SHOWN)


def test_an_argument_used_up_earlier_is_not_matched_twice() -> None:
    with pytest.raises(ConfigError, match="exec_start"):
        check_kept_command(_launch(args=("serve", "serve")), SHOWN)


def test_the_program_itself_is_not_taken_for_an_argument() -> None:
    with pytest.raises(ConfigError, match="exec_start"):
        check_kept_command(_launch(args=("/usr/bin/llama-server",)), SHOWN)


def test_the_refusal_names_the_first_four_arguments_and_the_fix() -> None:
    launch = _launch(args=("--lora-scaled", "b.gguf:0", "--alias", "x", "--jinja"))
    with pytest.raises(ConfigError) as refused:
        check_kept_command(launch, SHOWN)
    assert str(refused.value) == (
        "this configuration passes --lora-scaled b.gguf:0 --alias x, which the unit's ExecStart does not; "
        'set deploy.exec_start = "replace" in the study file so the drop-in carries the command line'
    )


def test_a_unit_whose_exec_start_shows_no_argv_passes_no_arguments() -> None:
    check_kept_command(_launch(), "")
    with pytest.raises(ConfigError, match="exec_start"):
        check_kept_command(_launch(args=("serve",)), "{ path=/usr/bin/ollama ; pid=0 }")


def test_only_the_first_command_of_exec_start_is_read() -> None:
    two = "{ path=/a ; argv[]=/a x ; ignore_errors=no } { path=/b ; argv[]=/b serve ; ignore_errors=no }"
    with pytest.raises(ConfigError, match="exec_start"):
        check_kept_command(_launch(args=("serve",)), two)


# ---- parse_show_environment --------------------------------------------------------------------


def test_bare_assignments_are_split_on_spaces() -> None:
    assert parse_show_environment("A=1 B=two  C=") == {"A": "1", "B": "two", "C": ""}


def test_a_quoted_assignment_keeps_its_spaces_and_loses_its_escapes() -> None:
    shown = '"A=x y" "B=q\\"uo\\\\te" C=3'
    assert parse_show_environment(shown) == {"A": "x y", "B": 'q"uo\\te', "C": "3"}


def test_a_value_keeps_its_own_equals_signs() -> None:
    assert parse_show_environment('A=b=c "D=e=f"') == {"A": "b=c", "D": "e=f"}


def test_leading_and_trailing_spaces_and_an_empty_text_give_nothing_extra() -> None:
    assert parse_show_environment("") == {}
    assert parse_show_environment("   A=1   ") == {"A": "1"}


def test_an_unterminated_quote_or_trailing_backslash_does_not_hang_or_crash() -> None:
    assert parse_show_environment('"A=x y') == {"A": "x y"}
    assert parse_show_environment('"A=x\\') == {"A": "x\\"}
    assert parse_show_environment('"A=x\\"') == {"A": 'x"'}  # cut off after an escaped quote


def test_what_render_drop_in_writes_is_what_parse_show_environment_reads_back() -> None:
    # systemd shows a value needing quotes in double quotes, with " and \ escaped as the drop-in has them.
    value = 'x "y" \\z'
    shown = 'A=1 "B=' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert parse_show_environment(shown) == {"A": "1", "B": value}
