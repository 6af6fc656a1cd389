"""What every ``perdure`` command shares: the store option, output, errors, exit codes.

Exit codes (stable, for scripts):

====  ===========================================================
0     success
1     the command ran and found a problem (``verify`` found damage)
2     bad usage: unknown option, malformed argument, unknown store scheme
3     not found (session, checkpoint, snapshot)
4     stored data is corrupted, or an import failed verification
5     the session is locked by another writer, or changed under us
6     any other perdure error
130   interrupted
====  ===========================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from perdure._runtime.loop import run_sync
from perdure.cli.output import console as console
from perdure.cli.output import json_option as json_option
from perdure.cli.output import terminal_safe
from perdure.crypto import AESGCMCipher, Cipher, keys_from_env
from perdure.errors import PerdureError
from perdure.session import SessionStore, open_store

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


STORE_READERS: set[Any] = set()
"""The option callbacks that take a ``--store`` given before the command: a command
with none of them among its options would ignore it, and is refused it instead."""


def reads_remembered_store(callback: F) -> F:
    """Mark an option callback as one that takes the ``--store`` given before the command."""
    STORE_READERS.add(callback)
    return callback


def takes_remembered_store(command: click.Command) -> bool:
    """Whether ``command`` has an option that takes a ``--store`` given before it."""
    return any(getattr(param, "callback", None) in STORE_READERS for param in command.params)


EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CORRUPTED = 4
EXIT_LOCKED = 5
EXIT_ERROR = 6
EXIT_INTERRUPTED = 130

_EXIT_BY_CODE = {
    "session_not_found": EXIT_NOT_FOUND,
    "checkpoint_not_found": EXIT_NOT_FOUND,
    "session_store_corrupted": EXIT_CORRUPTED,
    "checkpoint_import_invalid": EXIT_CORRUPTED,
    "snapshot_error": EXIT_CORRUPTED,
    "session_locked": EXIT_LOCKED,
    "storage_locked": EXIT_LOCKED,
    "memory_store_locked": EXIT_LOCKED,
    "session_conflict": EXIT_LOCKED,
    "turn_running": EXIT_LOCKED,
}

DEFAULT_STORE = "file:.perdure"

STORE_HELP = (
    "The session store: file:DIR, sqlite:PATH, postgresql://USER@HOST/DB[?schema=NAME] "
    "or memory: (env PERDURE_STORE); may also come before the command."
)

_STORE_KEY = "perdure.store"


def given_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A store option's URL: given after the command, else ``--store`` given before it,
    else the option's environment variable, else None."""
    source = ctx.get_parameter_source(param.name or "store_url")
    if source is click.core.ParameterSource.COMMANDLINE and value is not None:
        return value
    before = remembered_store(ctx)
    return before if before is not None else value


@reads_remembered_store
def _resolve_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """The store URL: ``--store`` after the command, else before it, else env, else default."""
    found = given_store(ctx, param, value)
    return found if found is not None else DEFAULT_STORE


@reads_remembered_store
def resolve_target_store(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """A required store option with another name (``--to``): it, else ``--store`` given
    before the command, else the environment; missing altogether is a usage error."""
    found = given_store(ctx, param, value)
    if found is None:
        raise click.MissingParameter(ctx=ctx, param=param)
    return found


def remembered_store(ctx: click.Context) -> str | None:
    """The ``--store`` given before the command (``perdure --store URL sessions list``)."""
    before = ctx.meta.get(_STORE_KEY)
    return before if isinstance(before, str) else None


def remember_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The group's ``--store`` callback: keep it for the command that follows."""
    if value is not None:
        ctx.meta[_STORE_KEY] = value
    return value


store_option = click.option(
    "--store",
    "-s",
    "store_url",
    envvar="PERDURE_STORE",
    default=None,
    show_default=DEFAULT_STORE,
    metavar="URL",
    callback=_resolve_store,
    help=STORE_HELP,
)


def exit_code_for(error: PerdureError) -> int:
    """The exit status a perdure error maps to.

    By its code; an error whose code says only that a backend failed
    (``memory_store_error``, ``storage_error``) is corrupted data (4) when it says
    the failure is damage (``details["fault"] == "damage"``: SQLite's
    ``SQLITE_CORRUPT`` or ``SQLITE_NOTADB``, a damaged stored value), and any
    other error (6) otherwise.
    """
    found = _EXIT_BY_CODE.get(error.code)
    if found is not None:
        return found
    details = getattr(error, "details", None) or {}
    return EXIT_CORRUPTED if details.get("fault") == "damage" else EXIT_ERROR


def env_cipher() -> Cipher | None:
    """The cipher of the keys in ``PERDURE_KEYS`` / ``PERDURE_KEYS_FILE``, if set.

    Every command opens its store (and snapshot storage) with it, so an encrypted
    store reads with the keys in the environment. The JSON's ``"active"`` names
    the key new records are written with; one key alone is active by itself.

    Raises:
        ValueError: the keys are malformed, or several and none is named active.
    """
    found = keys_from_env()
    if found is None:
        return None
    keys, active = found
    if active is None:
        if len(keys) != 1:
            raise ValueError(
                'PERDURE_KEYS: several keys and no "active": name the key to write with'
            )
        (active,) = keys
    return AESGCMCipher(keys=keys, active=active)


def open_cli_store(url: str, **options: Any) -> SessionStore:
    """Open a store from ``--store``; a bad URL is a usage error (exit 2). With keys in
    the environment (:func:`env_cipher`) the store is opened with them."""
    if "cipher" not in options:
        options["cipher"] = env_cipher()
    try:
        return open_store(url, **options)
    except (ValueError, ImportError) as exc:  # ImportError: the backend's extra is missing
        raise ValueError(f"--store: {exc}") from None


@contextlib.contextmanager
def session_store(
    url: str, *, must_exist: bool = True, file_only: str | None = None, **options: Any
) -> Iterator[SessionStore]:
    """Open the ``--store`` URL for one command, and close it afterwards.

    A malformed URL or unknown scheme is a one-line usage error (exit 2), and so is
    a store other than ``file:`` or ``sqlite:`` when ``file_only`` names a command
    that needs one.
    With ``must_exist``, a ``file:`` directory or ``sqlite:`` file that does not
    exist, or a ``postgresql://`` schema without perdure's tables, is reported
    (exit 3) rather than made into a new, empty store.
    """
    from perdure.session import FileSessionStore
    from perdure.stores.sqlite import SQLiteSessionStore

    store = open_cli_store(url, **options)
    if file_only is not None and not isinstance(store, FileSessionStore | SQLiteSessionStore):
        raise ValueError(
            f"{file_only} works on file and SQLite stores only (--store file:DIR or "
            f"sqlite:FILE), not {url!r}: quarantine moves records out of the store"
        )
    if must_exist:
        where = (
            store.root
            if isinstance(store, FileSessionStore)
            else store.path
            if isinstance(store, SQLiteSessionStore)
            else None
        )
        if where is not None and not where.exists():
            fail(f"no store at {where} (--store {url})", EXIT_NOT_FOUND)
        schema_exists = getattr(store, "schema_exists", None)  # a server store
        if schema_exists is not None and not run(schema_exists()):
            _close(store)
            fail(f"no store at {url} (no perdure tables in its schema)", EXIT_NOT_FOUND)
    try:
        yield store
    finally:
        _close(store)


def _close(store: SessionStore) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on perdure's loop (the CLI is sync)."""
    return run_sync(coro, async_name="the async API")


def read_key_file(path: str | None, option: str) -> bytes | None:
    """The HMAC key in ``path`` (its bytes, less one final newline), or None without a
    path: what ``--signing-key-file`` and ``--verify-key-file`` name.

    Raises:
        ValueError: the file cannot be read or holds no key (the message names the option).
    """
    if path is None:
        return None
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    key = key.removesuffix(b"\n").removesuffix(b"\r")
    if not key:
        raise ValueError(f"{option}: {path} holds no key")
    return key


def error_line(message: str) -> str:
    """The one line a failed command prints on stderr: ``error: message``.

    One line whatever the message quotes: its control characters (a newline, ESC)
    are shown as ``\\x0a``, ``\\x1b`` (:func:`~perdure.cli.output.terminal_safe`).
    """
    return f"error: {terminal_safe(message, chr(9))}"


def perdure_error_message(error: PerdureError) -> str:
    """How a perdure error is told on the error line: ``message [code]``."""
    return f"{error.message} [{error.code}]"


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` (:func:`error_line`) to stderr and exit with ``code``."""
    click.echo(error_line(message), err=True)
    sys.exit(code)


def handle_errors(command: F) -> F:
    """Turn perdure errors and bad values into a one-line message and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except PerdureError as exc:
            fail(perdure_error_message(exc), exit_code_for(exc))
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except (ValueError, TypeError) as exc:
            fail(str(exc), EXIT_USAGE)
        except OSError as exc:  # a store's environment failed (I/O, a server refused)
            fail(str(exc), EXIT_ERROR)
        except KeyboardInterrupt:
            fail("interrupted", EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


def to_jsonable(value: Any) -> Any:
    """Dataclasses, bytes and nested values as JSON-ready data (bytes are named, not dumped)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"bytes": len(value)}
    return value


def echo_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout."""
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))
