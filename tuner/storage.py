"""Where a study is stored, and opening it: the run directory's journal, or a fleet's database named by a
URL (`[storage] url`, `--storage`), for the loop or read-only for the reading commands.

A storage URL may carry a password: it is remembered as a secret (redacted from every line and log), never
written into the run directory (spec.json keeps the URL without it), and never printed. This module imports
neither the search loop nor the deployers: the reading commands open a study through it alone.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.errors import ConfigError, StudyError
from tuner.redact import redact, remember_secret
from tuner.runs import RunDirectory
from tuner.study_record import StudyRecord, TrialRecord

__all__ = [
    "has_measured_trials",
    "holds_study",
    "open_optuna_study_readonly",
    "open_storage",
    "recorded_storage",
    "remember_url",
    "shown_url",
    "stored_spec",
]

_FIX = "e.g. postgresql://tuner@db.example:5432/tuner"
_POSTGRES_DRIVERS = ("psycopg", "psycopg2")  # SQLAlchemy 2.1 assumes psycopg (3) for postgresql://
_CONNECT_TIMEOUT_S = 10
_SCHEMA_TRIES = 5


# The full URLs this process was given (the study file's, --storage), by their password-free form: what the
# run directory records is the latter, and a reader in this process (the leaderboard at the end of a run,
# the morning report rewritten after each trial) opens the storage with the former. Memory only.
_KNOWN_URLS: dict[str, str] = {}


def remember_url(url: str) -> str:
    """Registers a storage URL given to this process (its password as a secret); returns it without it."""
    shown = shown_url(url)
    _KNOWN_URLS[shown] = url
    return shown


def _parse(url: str) -> Any:
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError:
        raise ConfigError(
            "storage.url needs SQLAlchemy and a database driver, which are not installed: "
            ".venv/bin/pip install -e '.[fleet]' in the clone"
        ) from None
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"storage.url is not a database URL; give one such as {_FIX}") from None
    if parsed.password:
        remember_secret(str(parsed.password))
    return parsed


def shown_url(url: str) -> str:
    """The URL without its password: what is shown, and what the run directory keeps."""
    parsed = _parse(url)
    return str(parsed._replace(password=None).render_as_string(hide_password=False))  # set() keeps a None


def stored_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as spec.json keeps it: a storage URL without its password."""
    storage = spec.get("storage")
    if not isinstance(storage, dict) or not isinstance(storage.get("url"), str):
        return spec
    return {**spec, "storage": {**storage, "url": shown_url(storage["url"])}}


def _with_driver(parsed: Any) -> Any:
    """`postgresql://` with whichever PostgreSQL driver is installed."""
    if parsed.drivername != "postgresql":
        return parsed
    installed = [m for m in _POSTGRES_DRIVERS if importlib.util.find_spec(m) is not None]
    if not installed:
        raise ConfigError(
            "storage.url names PostgreSQL, and no driver for it is installed (psycopg2 or psycopg): "
            ".venv/bin/pip install -e '.[fleet]' in the clone"
        )
    return parsed.set(drivername=f"postgresql+{installed[0]}")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Optuna's RDBStorage on `url`. A bad URL or a missing driver: ConfigError (exit 2); a database that does
    not answer: StudyError (exit 1); either is one line, without the password."""
    shown = shown_url(url)
    parsed = _with_driver(_parse(_KNOWN_URLS.get(url, url)))
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": _CONNECT_TIMEOUT_S}
    from sqlalchemy.exc import IntegrityError, NoSuchModuleError, ProgrammingError

    for attempt in range(_SCHEMA_TRIES):
        try:
            return optuna.storages.RDBStorage(
                parsed.render_as_string(hide_password=False), engine_kwargs=kwargs, skip_compatibility_check=False
            )
        except (IntegrityError, ProgrammingError):
            # Controllers starting together on an empty database each create Optuna's tables; one wins, the
            # others see its tables half-made: a moment later they are whole.
            if attempt + 1 == _SCHEMA_TRIES:
                raise StudyError(
                    f"cannot create the study's tables in {shown}: another controller kept creating them; run again"
                ) from None
            time.sleep(0.5 * (attempt + 1))
        except ImportError as exc:
            raise ConfigError(f"storage.url {shown}: {exc}; .venv/bin/pip install -e '.[fleet]' in the clone") from None
        except NoSuchModuleError:  # a scheme SQLAlchemy has no dialect for: the URL is wrong, not the database
            raise ConfigError(
                f"storage.url {shown} names no database SQLAlchemy knows ({parsed.get_backend_name()}); "
                f"give one, {_FIX}"
            ) from None
        except Exception as exc:
            # SQLAlchemy's OperationalError and the driver's own: the first line names the cause
            # (connection refused, no such database, password authentication failed).
            text = str(getattr(exc, "orig", None) or exc).strip()
            first = redact(text.splitlines()[0]) if text else type(exc).__name__
            raise StudyError(
                f"cannot open the study's storage {shown}: {first}; check that the database runs and accepts "
                "this user (a password comes from the URL, PGPASSWORD or ~/.pgpass)"
            ) from None
    raise AssertionError("unreachable")


def recorded_storage(run_path: Path) -> tuple[str | None, str | None]:
    """The storage URL (without a password) and the study name the run directory's spec.json records."""
    stored = RunDirectory(run_path).read_spec()
    if stored is None:
        return None, None
    storage = stored.get("storage")
    name = stored.get("name") if isinstance(stored.get("name"), str) else None
    url = storage.get("url") if isinstance(storage, dict) and isinstance(storage.get("url"), str) else None
    return url, name


def holds_study(run_path: Path, storage_url: str | None = None) -> bool:
    """Whether a run directory holds a study: its journal, or a storage holding it (`storage_url`, the
    `--storage` a reader was given, or the one its spec.json names)."""
    run_dir = RunDirectory(run_path)
    return run_dir.journal.is_file() or storage_url is not None or recorded_storage(run_path)[0] is not None


def has_measured_trials(
    run_dir: RunDirectory, storage: optuna.storages.BaseStorage | None = None, *, name: str | None = None
) -> bool:
    """Whether a trial of the run directory's study (or of study `name` in `storage`) has measurements the
    leaderboard uses (complete or pruned after its first round); a failed start measured nothing, so its fix
    may change the spec."""
    if storage is None:
        if not run_dir.journal.exists():
            return False
        storage = run_dir.storage()
    names = optuna.get_all_study_names(storage)
    if not names or (name is not None and name not in names):
        return False
    study = optuna.load_study(study_name=name or names[0], storage=storage)
    # Every record is read here, before the resume writes anything: a damaged one is refused with the
    # run directory as it was.
    StudyRecord.of(study)
    records = [(trial.state, TrialRecord.of(trial)) for trial in study.get_trials(deepcopy=False)]
    return any(record.deployed for state, record in records if state in (TrialState.COMPLETE, TrialState.PRUNED))


def open_optuna_study_readonly(run_dir: RunDirectory, storage_url: str | None = None) -> optuna.Study:
    """Opens the study a run directory holds, for reading; works while a controller is running it. A fleet's
    study is read from the storage its spec.json names (the whole fleet's trials), or from `storage_url`."""
    recorded, name = recorded_storage(run_dir.path)
    url = storage_url or recorded
    storage = open_storage(url) if url else run_dir.storage()
    names = optuna.get_all_study_names(storage)
    if not names or (name is not None and name not in names):
        where = f"{run_dir.path}" if url is None else f"the storage {shown_url(url)}"
        raise StudyError(f"{where} holds no study {name or ''} yet".replace("  ", " "))
    return optuna.load_study(study_name=name if name in names else names[0], storage=storage)
