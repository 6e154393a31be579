"""What a new user meets in the first hour: every mistake in how a command is started
ends in one line that says what is wrong and what to do, an exit code, no traceback."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from shadowpod.journal.sqlite.store import SQLiteJournalStore
from tests.conftest import PG_DSN, drop_pg_schema, postgres_unavailable

# Root without its capabilities: permissions then apply to it as to any user, while the
# checkout (which may be private to root, as in a fresh clone under a 0700 directory)
# stays readable — as another user it would not be.
UNPRIVILEGED = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


def shadowpod(
    *args: str, cwd: Path | None = None, unprivileged: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(UNPRIVILEGED if unprivileged else []), sys.executable, "-m", "shadowpod", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command's one line of error: the last on stderr (log lines may come before)."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0]), result.stderr
    return errors[0]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "control-token"
    path.write_text("a-control-token\n")
    return path


def gateway(journal: str, token_file: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return shadowpod(
        "gateway", "--journal", journal, "--control-token-file", str(token_file),
        "--host", "127.0.0.1", "--port", "0", *more,
    )  # fmt: skip


# --- the journal ----------------------------------------------------------------------


def test_postgresql_down(token_file: Path) -> None:
    result = gateway("postgresql://127.0.0.1:1/shadowpod", token_file)
    assert result.returncode == 1
    line = error_line(result)
    assert line.startswith("error: the gateway cannot start: cannot reach PostgreSQL")
    assert "check the DSN and that the server is up" in line


def test_a_journal_path_that_is_a_directory(tmp_path: Path, token_file: Path) -> None:
    result = gateway(f"sqlite://{tmp_path}", token_file)
    assert result.returncode == 1
    assert error_line(result) == (
        f"error: the gateway cannot start: the SQLite journal {tmp_path} is a directory: "
        f"name a file in it, e.g. sqlite://{tmp_path}/journal.db"
    )


def test_a_journal_path_that_is_a_text_file(tmp_path: Path, token_file: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("these are not the journal you are looking for\n" * 100)
    result = gateway(f"sqlite://{notes}", token_file)
    assert result.returncode == 1
    assert f"{notes} is not a SQLite database" in error_line(result)
    assert notes.read_text().startswith("these are not")  # left as it was


def test_a_journal_under_a_file(tmp_path: Path, token_file: Path) -> None:
    (tmp_path / "plain").write_text("x")
    result = gateway(f"sqlite://{tmp_path}/plain/journal.db", token_file)
    assert result.returncode == 1
    assert f"{tmp_path}/plain is a file, not a directory" in error_line(result)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with a control token, for the gateway run without privileges."""
    (tmp_path / "token").write_text("a-control-token\n")
    return tmp_path


def unprivileged_gateway(
    workdir: Path, journal: str, *, port: int
) -> subprocess.CompletedProcess[str]:
    """The gateway run without privileges (root without its capabilities, when we are root)."""
    return shadowpod(
        "gateway", "--journal", journal,
        "--control-token-file", str(workdir / "token"), "--port", str(port),
        unprivileged=os.geteuid() == 0,
    )  # fmt: skip


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="as root every directory is writable; needs setpriv to drop root's capabilities",
)
def test_a_journal_in_a_directory_this_user_may_not_write(workdir: Path) -> None:
    locked = workdir / "locked"
    locked.mkdir(mode=0o555)
    result = unprivileged_gateway(workdir, f"sqlite://{locked}/journal.db", port=0)
    assert result.returncode == 1
    assert error_line(result) == (
        f"error: the gateway cannot start: cannot create the SQLite journal "
        f"{locked}/journal.db: this user may not write in {locked}; choose a writable "
        "directory or fix its permissions"
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://db/shadowpod", "unsupported journal URL 'mysql://db/shadowpod'"),
        ("sqlite:///", "journal URL 'sqlite:///' names no file"),
        (
            "postgresql://127.0.0.1/test?shadowpod_schema=1st",
            "invalid PostgreSQL schema name '1st'",
        ),
    ],
)
def test_a_journal_url_we_cannot_use_is_a_bad_setting(
    url: str, says: str, token_file: Path
) -> None:
    result = gateway(url, token_file)
    assert result.returncode == 2
    assert error_line(result).startswith(f"error: {says}")


def test_a_sqlite_journal_of_a_newer_shadowpod(tmp_path: Path, token_file: Path) -> None:
    path = tmp_path / "journal.db"

    async def create() -> None:
        async with SQLiteJournalStore(path):
            pass

    asyncio.run(create())
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE shadowpod_meta SET value = '99' WHERE key = 'schema_version'")
    result = gateway(f"sqlite://{path}", token_file)
    assert result.returncode == 1
    line = error_line(result)
    assert "journal database has schema v99" in line and "upgrade Shadowpod" in line


def test_a_postgresql_journal_of_a_newer_shadowpod(token_file: Path) -> None:
    if reason := postgres_unavailable():
        pytest.skip(reason)
    schema = f"test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE TABLE {schema}.meta (key text PRIMARY KEY, value text)")
            conn.execute(f"INSERT INTO {schema}.meta VALUES ('schema_version', '99')")
        result = gateway(f"{PG_DSN}?shadowpod_schema={schema}", token_file)
    finally:
        drop_pg_schema(schema)
    assert result.returncode == 1
    assert "journal database has schema v99" in error_line(result)


# --- tokens and the address -----------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "holds no token: write one token per line"),
        (b"# only a comment\n\n", "holds no token: write one token per line"),
        (b"\xff\xfe\x00binary", "is not text: write one token per line (UTF-8)"),
    ],
    ids=["empty", "comments-only", "binary"],
)
def test_a_token_file_without_a_token(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "tokens"
    bad.write_bytes(content)
    result = gateway(f"sqlite://{tmp_path}/journal.db", bad)
    assert result.returncode == 2
    assert says in error_line(result)
    assert not (tmp_path / "journal.db").exists()  # refused before anything was created


def test_a_port_in_use(tmp_path: Path, token_file: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = shadowpod(
            "gateway", "--journal", f"sqlite://{tmp_path}/journal.db",
            "--control-token-file", str(token_file), "--port", str(port),
        )  # fmt: skip
    assert result.returncode == 1
    assert error_line(result) == (
        f"error: cannot listen on 127.0.0.1:{port}: another process is listening there; "
        "stop it or choose another --port"
    )
    # Its log never said it was ready: it was not.
    assert "gateway ready" not in result.stderr


def _unprivileged_port_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except OSError:
        return 1024


@pytest.mark.skipif(
    (os.geteuid() == 0 and shutil.which("setpriv") is None) or _unprivileged_port_start() <= 80,
    reason="needs a user who may not listen on port 80",
)
def test_a_privileged_port(workdir: Path) -> None:
    result = unprivileged_gateway(workdir, f"sqlite://{workdir}/journal.db", port=80)
    assert result.returncode == 1
    assert error_line(result) == (
        "error: cannot listen on 127.0.0.1:80: this user may not use port 80 (ports below "
        "1024 need privileges); choose another --port"
    )


def test_an_address_not_of_this_machine(tmp_path: Path, token_file: Path) -> None:
    result = shadowpod(
        "gateway", "--journal", f"sqlite://{tmp_path}/journal.db",
        "--control-token-file", str(token_file), "--host", "192.0.2.1", "--port", "0",
    )  # fmt: skip
    assert result.returncode == 1
    assert "192.0.2.1 is not an address of this machine" in error_line(result)


def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path, token_file: Path) -> None:
    result = gateway(f"sqlite://{tmp_path}/journal.db", token_file, "--log-level", "loud")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in result.stderr


# --- the demo ---------------------------------------------------------------------------


def test_the_demo_keeps_a_relative_workdir_where_it_was_run_and_refuses_to_reuse_it(
    tmp_path: Path,
) -> None:
    name = f"demo-{uuid.uuid4().hex[:8]}"
    demo = ("demo", "--json", "--rate", "20", "--before", "0.5", "--after", "0.5")
    try:
        first = shadowpod(*demo, "--workdir", name, cwd=tmp_path, timeout=120)
        assert first.returncode == 0, first.stderr
        assert (tmp_path / name / "gateway" / "journal.db").is_file()
        assert not Path("/", name).exists()  # not sqlite:/// + the relative path
        again = shadowpod(*demo, "--workdir", name, cwd=tmp_path, timeout=120)
    finally:
        shutil.rmtree(Path("/", name), ignore_errors=True)
    assert again.returncode == 2
    assert error_line(again) == (
        f"error: --workdir {name} is not empty (an earlier run's journal and logs?): give a "
        "new or empty directory, or remove this one"
    )


def test_the_demo_says_why_an_agent_could_not_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shadowpod", "demo", "--json", "--before", "0", "--after", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SHADOWPOD_EXAMPLES": str(tmp_path / "no-examples")},
    )
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("error: the demo could not run: instance 'demo-v1' exited with code 2")
    assert f"can't open file '{tmp_path}/no-examples/01-reference-agent/refagent.py'" in line
    assert line.endswith("(run it with --workdir DIR to keep its logs)")


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="as root every directory is writable; needs setpriv to drop root's capabilities",
)
@pytest.mark.parametrize("command", ["up", "demo"])
def test_a_workdir_this_user_may_not_write(tmp_path: Path, command: str) -> None:
    """Said before anything starts, not as a failure whose logs are 'in' that directory."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = shadowpod(command, "--workdir", str(locked), unprivileged=os.geteuid() == 0)
    assert result.returncode == 2
    assert error_line(result) == (
        f"error: cannot write in --workdir {locked} (Permission denied): choose a directory "
        "this user may write in, or fix its permissions"
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"KUBECONFIG": "/nonexistent/kubeconfig"}, "no kubeconfig at /nonexistent/kubeconfig"),
        ({"HOME": "/nonexistent"}, "no kubeconfig at ~/.kube/config"),
    ],
    ids=["KUBECONFIG", "none"],
)
def test_kubectl_without_a_kubeconfig(env: dict[str, str], says: str) -> None:
    keep = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    result = subprocess.run(
        [sys.executable, "-m", "shadowpod", "kubectl", "status"],
        env={**keep, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3
    assert error_line(result) == (
        f"error: {says}: give one with --kubeconfig or KUBECONFIG (kubectl's own works), "
        "and --context to pick a context"
    )


def test_a_kubeconfig_that_names_no_cluster(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    result = shadowpod("kubectl", "--kubeconfig", str(kubeconfig), "status")
    assert result.returncode == 3
    assert error_line(result).startswith(f"error: no usable kubeconfig ({kubeconfig}: ")


def test_an_agent_run_by_hand_says_how_to_run_it() -> None:
    refagent = Path(__file__).parents[2] / "examples" / "01-reference-agent" / "refagent.py"
    keep = {k: v for k, v in os.environ.items() if not k.startswith("SHADOWPOD_")}
    result = subprocess.run(
        [sys.executable, str(refagent), "--version", "1"],
        env=keep,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    line = error_line(result)
    assert line.startswith("error: this is a Shadowpod agent: Shadowpod starts it")
    assert "`shadowpod up --images MAP --image NAME`" in line
