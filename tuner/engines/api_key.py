"""The server's API key, as every engine takes it: from a variable of the controller's environment or a
file only its owner can read, never from the study file, a command line or the run directory. Requests
carry it as a Bearer token; a server the study starts itself gets it through a file only that server can
read (the engine says under which variable: LLAMA_API_KEY, VLLM_API_KEY)."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tuner.config import StrictModel
from tuner.errors import ConfigError
from tuner.files import special_file
from tuner.redact import SECRET_REFUSED, looks_like_secret, remember_secret

__all__ = ["ApiKeyOptions", "bearer_headers", "check_key", "is_pasted_key", "load_api_key"]

_KEY_FILE_LIMIT = 4096  # bytes; a key is far shorter, and a file this large was given by mistake
_KEY_CHARACTERS = re.compile(r"[!-~]+", re.ASCII)


class ApiKeyOptions(StrictModel):
    api_key_env: str | None = Field(
        default=None,
        description="Name of an environment variable of the controller that holds the server's API key "
        "(not the key itself, which stays out of study files). Requests send it as a Bearer token.",
    )
    api_key_file: str | None = Field(
        default=None,
        description="A file on the controller whose first line is the server's API key, readable by its owner "
        "alone (chmod 600), as for api_key_env.",
    )

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _a_name_not_a_key(cls, value: object) -> object:
        # Refused before any other check, whose message would quote the value: a pasted key must not
        # reach the terminal, a log or the run directory.
        if isinstance(value, str) and looks_like_secret(value):
            raise PydanticCustomError(
                SECRET_REFUSED,
                "must name the environment variable that holds the server's API key (like LLAMA_API_KEY), "
                "not the key; the value given is no variable name and may be the key itself, so it is not "
                "shown: export the key as a variable and put the variable's name here",
            )
        return value

    @field_validator("api_key_file", mode="before")
    @classmethod
    def _a_path_not_a_key(cls, value: object) -> object:
        # A path has a separator or a dot; a bare word of a key's shape is the key pasted here, never echoed.
        if isinstance(value, str) and is_pasted_key(value):
            raise PydanticCustomError(
                SECRET_REFUSED,
                "must be the path of a file holding the server's API key, not the key; the value given looks like "
                "the key itself, so it is not shown: write the key into a file (chmod 600) and put its path here",
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ApiKeyOptions:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give the API key by api_key_env or api_key_file, not both")
        return self


def bearer_headers(key: SecretStr | None) -> dict[str, str]:
    """The Authorization header every request carries, or none without a key."""
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}


def is_pasted_key(path: str) -> bool:
    """Whether a value given as a key file's path is rather the key: a long bare word (no separator, dot
    or `~`) of a key's look."""
    return len(path) >= 16 and not any(c in path for c in "/.~") and looks_like_secret(path)


def load_api_key(options: ApiKeyOptions) -> SecretStr | None:
    """The key the options name, remembered so that whatever a server says back with it in is scrubbed
    before it is shown; None without one. `ConfigError` for a variable not set or a file that will not do."""
    if options.api_key_env is not None:
        value = os.environ.get(options.api_key_env)
        if not value:
            raise ConfigError(
                f"engine.api_key_env names {options.api_key_env}, which is not set here; export it with the "
                "server's API key before running"
            )
        check_key(value, source=options.api_key_env)
    elif options.api_key_file is not None:
        value = _read_key_file(Path(options.api_key_file).expanduser())
        check_key(value, source=f"engine.api_key_file {options.api_key_file}")
    else:
        return None
    remember_secret(value)
    return SecretStr(value)


def _read_key_file(path: Path) -> str:
    said = f"engine.api_key_file {path}"
    special = special_file(path)
    if special is not None:  # a FIFO would block the read, a device never end it
        raise ConfigError(f"{said} is {special}, not a file; write the server's API key into a regular file")
    try:
        mode = path.stat().st_mode
        with path.open("rb") as file:
            raw = file.read(_KEY_FILE_LIMIT + 1)
    except FileNotFoundError:
        raise ConfigError(f"{said} does not exist; write the server's API key into it (chmod 600)") from None
    except OSError as exc:
        raise ConfigError(f"{said} cannot be read ({type(exc).__name__}); give a file with the key") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        # As ssh does with a private key: a key others can read is not kept secret, and this refuses it early.
        fix = f"chmod 600 {shlex.quote(str(path))}"
        raise ConfigError(f"{said} can be read by others (mode {stat.S_IMODE(mode):o}); run {fix}")
    if len(raw) > _KEY_FILE_LIMIT:
        raise ConfigError(f"{said} is over {_KEY_FILE_LIMIT} bytes, more than a key; give a file with the key alone")
    try:
        text = raw.decode("utf-8-sig")  # a Windows editor's byte-order mark is no part of the key
    except UnicodeDecodeError:
        raise ConfigError(f"{said} is not text; write the server's API key on its first line") from None
    lines = text.strip().splitlines()
    value = lines[0].strip() if lines else ""
    if not value:
        raise ConfigError(f"{said} is empty; write the server's API key on its first line")
    return value


def check_key(value: str, *, source: str) -> None:
    """An HTTP header carries visible ASCII only: a key with anything else would fail every request with a
    traceback. Refused naming where it came from, never showing it."""
    if not _KEY_CHARACTERS.fullmatch(value):
        raise ConfigError(
            f"the API key in {source} has a space, a control or a non-ASCII character, which no Authorization "
            "header can carry; give the key alone, in visible ASCII"
        )
