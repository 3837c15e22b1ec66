"""The usage-proxy command line: its parser and its --help texts."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from proxy.cli import build_parser, main
from proxy.settings import FILE_ONLY, Mode, Settings, load_settings


def help_text(command: str) -> str:
    """What ``python -m proxy COMMAND --help`` prints, as an operator sees it."""
    argv = [sys.executable, "-m", "proxy", command, "--help"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_bad_mode_is_rejected_by_the_parser() -> None:
    """--mode only takes rewrite, annotate or shadow."""
    with pytest.raises(SystemExit):
        build_parser()[0].parse_args(["serve", "--upstream", "http://x", "--mode", "loud"])


def test_help_explains_every_option() -> None:
    """serve --help lists each settings field with its env var and default."""
    out = help_text("serve")
    for name, _field in Settings.model_fields.items():
        if name in FILE_ONLY:  # file/env only (secrets, structure)
            assert "--" + name.replace("_", "-") not in out
            continue
        assert "--" + name.replace("_", "-") in out
        assert f"USAGE_PROXY_{name.upper()}" in out
    assert "PydanticUndefined" not in out
    assert "default: host name" in " ".join(out.split())
    assert "--config" in out


def test_report_help_has_no_literal_percent_escapes() -> None:
    """report --help used to print a literal '%%'."""
    out = help_text("report")
    assert "%%" not in out
    assert "yesterday" in out


def _serve(argv: list[str], config: Path | None = None) -> Settings:
    """Settings as ``usage-proxy serve ARGV`` builds them (the flags through
    pydantic-settings' CLI source)."""
    parser, flags = build_parser()
    args = parser.parse_args(["serve", *argv])
    return load_settings({}, config or args.config, flags=flags(parsed_args=args))


def test_help_lists_the_values_of_every_enum_setting() -> None:
    """Regression: --durability and --upstream-transformers offered no choices in --help
    (the flags were written by hand beside the model). Every enum or Literal field now
    shows its values, from the model."""
    out = " ".join(help_text("serve").split())
    shown = 0
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            values = [str(m.value) for m in annotation]
        elif get_origin(annotation) is Literal:
            values = [str(v) for v in get_args(annotation)]
        else:
            continue
        shown += 1
        assert f"--{name.replace('_', '-')} {{{','.join(values)}}}" in out, name
    assert shown >= 4  # mode, upstream_transformers, event_loop, durability


@pytest.mark.parametrize(
    ("argv", "anonymous"),
    [
        ([], False),
        (["--allow-anonymous"], True),
        (["--allow-anonymous", "true"], True),
        (["--allow-anonymous", "false"], False),
        (["--allow-anonymous=true"], True),
    ],
)
def test_a_boolean_is_a_plain_flag_that_still_takes_a_value(
    argv: list[str], anonymous: bool
) -> None:
    """Regression: booleans needed a literal ``true``. A plain flag now sets one, and
    ``--flag true`` / ``--flag false`` (as the docs write them) still work."""
    assert _serve(["--upstream", "http://x", *argv]).allow_anonymous is anonymous


def test_structured_and_secret_settings_are_not_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """models and cloudevents_headers stay out of argv (visible to every local user)."""
    with pytest.raises(SystemExit):
        build_parser()[0].parse_args(
            ["serve", "--upstream", "http://x", "--cloudevents-headers", '{"a": "b"}']
        )
    assert "unrecognized arguments" in capsys.readouterr().err


def test_flag_beats_environment_beats_file_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The precedence the README documents, through the real command line."""
    config = tmp_path / "proxy.toml"
    config.write_text('upstream = "http://file:1"\nport = 7000\nmode = "shadow"\nhost = "h"\n')
    monkeypatch.setenv("USAGE_PROXY_PORT", "7001")
    monkeypatch.setenv("USAGE_PROXY_MODE", "annotate")
    monkeypatch.setenv("USAGE_PROXY_CONFIG", str(config))
    settings = _serve(["--mode", "rewrite"])
    assert settings.mode is Mode.REWRITE  # flag over environment and file
    assert settings.port == 7001  # environment over file
    assert (settings.upstream_base, settings.host) == ("http://file:1", "h")  # file
    assert settings.read_timeout == 600.0  # default


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.yaml", "port: [1\n", "is not valid"),
        ("bad.toml", "port = \n", "is not valid"),
        ("list.yaml", "- port\n", "must hold a mapping"),
        ("missing.yaml", None, "cannot read config file"),
    ],
)
def test_config_file_errors_name_the_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str | None,
    message: str,
) -> None:
    """A file that cannot be read or parsed exits 2 with its path in the message."""
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    assert main(["serve", "--upstream", "http://x", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage-proxy: ")
    assert message in err
    assert str(path) in err


def test_invalid_values_in_a_config_file_say_where_they_can_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value the settings refuse names every place it can be set (flag, environment,
    the config file); a key that is no setting says so, with the file, instead of
    inventing a flag that does not exist; a value set only by env or file names no flag."""
    path = tmp_path / "proxy.yaml"
    path.write_text("port: abc\nnope: 1\ncache_salt_secret: 5\n")
    assert main(["serve", "--upstream", "http://x", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--port, USAGE_PROXY_PORT or `port` in {path}: Input should be a valid integer" in err
    assert f"`nope` in {path} is not a setting (usage-proxy serve --help lists them)" in err
    assert "--nope" not in err
    assert "--cache-salt-secret" not in err


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@127.0.0.1:6379/0",
        "valkeys://proxy:s3cret@valkey:6379/0",
        "redis://127.0.0.1:6379/0?password=s3cret",
    ],
)
def test_a_limits_store_password_on_the_command_line_is_refused(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    """--limits-store with a password in its URL (user info or query) exits 2 before
    anything starts, saying where the password goes, without echoing it (argv is
    visible to every user of the host, and error lines reach logs)."""
    assert main(["serve", "--upstream", "http://x", "--limits-store", url]) == 2
    err = capsys.readouterr().err
    assert "no password on the command line" in err
    assert "USAGE_PROXY_LIMITS_STORE_PASSWORD" in err
    assert "s3cret" not in err


def test_limits_check_says_each_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #54 item 4: an unknown model, a tenant the key file lacks, a misspelt limit
    and an empty file were taken without a word. `usage-proxy limits check` prints one
    line per problem and exits 2, or what the file sets and exits 0."""
    import hashlib
    import http.server
    import threading

    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {hashlib.sha256(b'k').hexdigest()}\n")
    limits = tmp_path / "limits.yaml"
    limits.write_text(
        "tenants:\n  acme: {requests_per_minute: 5, models: {e5-smal: {requests_per_day: 1}}}\n"
        "  acmee: {requests_per_day: 5}\n"
    )

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"data": [{"id": "e5-small"}, {"id": "bge"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        args = ["limits", "check", str(limits), "--api-keys", str(keys), "--upstream", upstream]
        assert main(args) == 2
    finally:
        server.shutdown()
        server.server_close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"{limits}: tenants.acme.models.e5-smal: the upstream serves no model 'e5-smal' (it "
        "serves bge, e5-small); did you mean 'e5-small'?",
        f"{limits}: tenants.acmee: no tenant 'acmee' in the --api-keys file, so no request is "
        "ever billed to it; did you mean 'acme'?",
    ]
    limits.write_text("tenants:\n  acme: {prompt_token_per_minute: 5}\n")
    assert main(["limits", "check", str(limits)]) == 2
    out = capsys.readouterr().err
    assert "did you mean 'prompt_tokens_per_minute'?" in out
    assert "pydantic" not in out
    limits.write_text("")
    assert main(["limits", "check", str(limits)]) == 2
    assert "the file sets no limit" in capsys.readouterr().err
    limits.write_text("timezone: Europe/Paris\ntenants:\n  acme: {requests_per_month: 300}\n")
    assert main(["limits", "check", str(limits), "--models", "e5-small"]) == 0
    assert capsys.readouterr().out == (
        f"{limits}: OK, 1 limit(s) at 1 level(s) (1 calendar budget(s)): 1 tenant(s); "
        "periods in Europe/Paris\n"
    )
    assert main(["limits", "check", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml does not exist" in capsys.readouterr().err


def test_limits_check_says_every_problem_in_one_pass_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 3: a misspelt limit, a tenant the key file lacks and a model the
    upstream does not serve were found one rerun at a time (the first stopped the check),
    on stdout. All three are said in one pass, on stderr, and the check exits 2."""
    import hashlib

    keys = tmp_path / "keys.yaml"
    keys.write_text(f"acme: {hashlib.sha256(b'k').hexdigest()}\n")
    limits = tmp_path / "limits.yaml"
    limits.write_text(
        "tenants:\n"
        "  acme: {prompt_token_per_minute: 5, models: {e5-smal: {requests_per_day: 1}}}\n"
        "  acmee: {requests_per_day: 5}\n"
    )
    args = ["limits", "check", str(limits), "--api-keys", str(keys), "--models", "e5-small"]
    assert main(args) == 2
    said = capsys.readouterr()
    assert said.out == ""
    errors = said.err
    assert "did you mean 'prompt_tokens_per_minute'?" in errors
    assert "no tenant 'acmee' in the --api-keys file" in errors
    assert "the upstream serves no model 'e5-smal'" in errors


def test_limits_check_says_the_files_problems_when_the_upstream_cannot_be_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 3 (one pass): an --upstream that could not be asked stopped the
    check, so a misspelt limit and a missing key file were said only on the next run.
    The unreachable upstream is said with them (its model names unchecked), exit 2."""
    import socket

    with socket.socket() as closed:  # bound, never listening: a connection is refused
        closed.bind(("127.0.0.1", 0))
        upstream = f"http://127.0.0.1:{closed.getsockname()[1]}"
        limits = tmp_path / "limits.yaml"
        limits.write_text("tenants:\n  acme: {prompt_token_per_minute: 5}\n")
        keys = tmp_path / "keys.yaml"
        args = ["limits", "check", str(limits), "--api-keys", str(keys), "--upstream", upstream]
        assert main(args) == 2
    errors = capsys.readouterr().err
    assert "did you mean 'prompt_tokens_per_minute'?" in errors
    assert f"cannot list the models of {upstream}/v1/models" in errors
    assert "--api-keys" in errors
    assert "no such file" in errors


def test_limits_check_of_a_missing_file_still_checks_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 3 (one pass): a limits file that is not there stopped the check
    before the price file was read; both are said."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: USD\nmodels: {m: {prompt_token: '1'}}\n")
    args = ["limits", "check", str(tmp_path / "none.yaml"), "--prices", str(prices)]
    assert main(args) == 2
    errors = capsys.readouterr().err
    assert "none.yaml does not exist" in errors
    assert "did you mean 'prompt_tokens'?" in errors


def test_limits_check_with_prices_holds_money_budgets_as_serve_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 3: a cost_per_month without a price file passed the check and then
    failed serve. Without --prices it fails the check as serve fails; with a price file
    that prices the served model now it passes; one that does not is named."""
    limits = tmp_path / "limits.yaml"
    limits.write_text("tenants:\n  acme: {cost_per_month: '10'}\n")
    assert main(["limits", "check", str(limits)]) == 2
    assert "cost_per_* budgets need a price file (--prices)" in capsys.readouterr().err
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: USD\nmodels: {e5-small: {prompt_tokens: '0.000001'}}\n")
    check = ["limits", "check", str(limits), "--prices", str(prices), "--models"]
    assert main([*check, "e5-small"]) == 0
    capsys.readouterr()
    assert main([*check, "e5-small,bge"]) == 2
    assert "no price in force now for 'bge'" in capsys.readouterr().err
    prices.write_text("currency: USD\nmodels: {e5-small: {prompt_token: '0.000001'}}\n")
    assert main([*check, "e5-small"]) == 2
    assert "did you mean 'prompt_tokens'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["limits", "check", "nope.yaml"], "the limits file nope.yaml does not exist"),
        (["report", "--limits", "nope.yaml"], "--limits nope.yaml does not exist"),
        (["report", "--prices", "nope.yaml"], "--prices nope.yaml does not exist"),
    ],
)
def test_a_missing_file_is_named_with_its_flag(
    argv: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #59 item 4: a missing limits or price file printed a raw `[Errno 2]` without
    naming the flag. It is named, and said not to exist."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("USAGE_PROXY_CONFIG", raising=False)
    journal = ["--journal", str(tmp_path / "j.sqlite")] if argv[0] == "report" else []
    assert main([*argv, *journal]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "Errno" not in err


def test_a_refused_setting_is_said_without_pydantics_wording(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59 item 4: a setting a validator refuses was said with pydantic's own
    prefix (`Value error, must be one of ...`). Only the sentence is said, with where the
    setting comes from."""
    monkeypatch.setenv("USAGE_PROXY_LOG_LEVEL", "loud")
    assert main(["serve", "--upstream", "http://x"]) == 2
    err = capsys.readouterr().err
    assert "USAGE_PROXY_LOG_LEVEL: must be one of debug, info, warning, error" in err
    assert "Value error" not in err
