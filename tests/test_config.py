import subprocess
import sys

import pytest

from gateway.config import ConfigError, Secret, load_settings, redact_url


def test_defaults_without_environment() -> None:
    settings = load_settings({})
    assert settings.port == 8080 and settings.host == "127.0.0.1"
    assert settings.dedup_ttl == 86400 and settings.lease_seconds == 90
    assert settings.heartbeat_seconds == 30 and settings.reclaim_seconds == 60
    assert settings.max_reclaims == 3 and settings.max_failures == 3
    assert settings.listener_lease_seconds == 15
    assert settings.telegram_api_url == "https://api.telegram.org"
    assert settings.slack_api_url == "https://slack.com/api/"


@pytest.mark.parametrize(("env", "variable"), [
    ({"GATEWAY_PORT": "eighty"}, "GATEWAY_PORT"),
    ({"GATEWAY_PORT": "70000"}, "GATEWAY_PORT"),
    ({"GATEWAY_DURABLE_URL": "http://x"}, "GATEWAY_DURABLE_URL"),
    ({"GATEWAY_CACHE_URL": "memcached://x"}, "GATEWAY_CACHE_URL"),
    ({"GATEWAY_DATABASE_URL": "mysql://x"}, "GATEWAY_DATABASE_URL"),
    ({"GATEWAY_DURABLE_URL": "redis://:pw@127.0.0.1:sixty/0"}, "GATEWAY_DURABLE_URL"),
    ({"GATEWAY_CACHE_URL": "redis+cluster://h1:7000,h2:70000/"}, "GATEWAY_CACHE_URL"),
    ({"GATEWAY_DATABASE_URL": "postgresql://u@h:5x/db"}, "GATEWAY_DATABASE_URL"),
    ({"GATEWAY_LEASE_SECONDS": "0"}, "GATEWAY_LEASE_SECONDS"),
    ({"GATEWAY_DEDUP_TTL": "-5"}, "GATEWAY_DEDUP_TTL"),
    ({"GATEWAY_HEARTBEAT_SECONDS": "120"}, "GATEWAY_HEARTBEAT_SECONDS"),
    ({"TELEGRAM_API_URL": "not a url"}, "TELEGRAM_API_URL"),
    ({"MATTERMOST_URL": "http://mm.local"}, "MATTERMOST_TOKEN"),
    ({"GATEWAY_WEBHOOK_SECRETS": "nosecret"}, "GATEWAY_WEBHOOK_SECRETS"),
    # A colon would blur where the source ends in its item ids (the documents' owner).
    ({"GATEWAY_WEBHOOK_SECRETS": "a:b=whsec_c2VjcmV0"}, "GATEWAY_WEBHOOK_SECRETS"),
    ({"GATEWAY_CONFIG": "/nonexistent/gateway.toml"}, "GATEWAY_CONFIG"),
])
def test_wrong_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert info.value.variable == variable
    assert str(info.value).startswith(variable)


def test_webhook_secrets_schemes_and_errors_hide_secret() -> None:
    settings = load_settings({"GATEWAY_WEBHOOK_SECRETS":
                              "a=whsec_c2VjcmV0,b=github:ghs,c=stripe:sk_1"})
    assert {k: v.scheme for k, v in settings.webhook_sources.items()} == {
        "a": "standard", "b": "github", "c": "stripe"}
    assert settings.webhook_sources["a"].key_bytes() == b"secret"
    with pytest.raises(ConfigError) as info:
        load_settings({"GATEWAY_WEBHOOK_SECRETS": "a=whsec_%%%notbase64-topsecret"})
    assert "topsecret" not in str(info.value)


def test_secrets_never_print() -> None:
    settings = load_settings({"TELEGRAM_BOT_TOKEN": "123:ABCDEF", "GATEWAY_ADMIN_TOKEN": "adm"})
    assert "ABCDEF" not in repr(settings) and "adm'" not in repr(settings)
    assert str(Secret("x")) == "Secret('***')"
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"


def test_toml_file_with_environment_override(tmp_path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nport = 9000\nhost = "0.0.0.0"\n[pipeline.handlers]\n'
                    'embed = "mod:fn"\n')
    settings = load_settings({"GATEWAY_CONFIG": str(path), "GATEWAY_PORT": "9100"})
    assert settings.port == 9100 and settings.host == "0.0.0.0"
    assert settings.section("pipeline")["handlers"]["embed"] == "mod:fn"
    path.write_text("[gateway]\nnot_a_setting = 1\n")
    with pytest.raises(ConfigError):
        load_settings({"GATEWAY_CONFIG": str(path)})


def test_cli_config_error_is_one_line_without_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "doctor"],
        env={"GATEWAY_PORT": "nope", "PATH": "/usr/bin:/bin",
             "GATEWAY_ADMIN_TOKEN": "s3cr3t-value"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["gateway: configuration error: GATEWAY_PORT: must be an integer (got 'nope')"]
    assert "Traceback" not in result.stderr and "s3cr3t" not in result.stderr


def test_cli_redis_url_with_a_bad_port_is_one_line_without_the_password() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "doctor"],
        env={"GATEWAY_DURABLE_URL": "redis://:hunter2@127.0.0.1:63790x/0", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gateway: configuration error: GATEWAY_DURABLE_URL: port '63790x' is not a number 1-65535"]
    assert "hunter2" not in result.stderr


@pytest.mark.parametrize(("table", "wrong", "names"), [
    ("pipeline", "batch = 0", "[pipeline].batch"),
    ("pipeline", 'backoff_seconds = "soon"', "[pipeline].backoff_seconds"),
    ("pipeline", "bacth = 4", "[pipeline].bacth"),
    ("outbound", 'attempts = "many"', "[outbound].attempts"),
    ("outbound", "backoff_max = -1", "[outbound].backoff_max"),
    ("security", "brute_window = []", "[security].brute_window"),
    ("security", 'trusted_proxies = ["10.0.0.0/33"]', "[security].trusted_proxies"),
])
def test_tunable_tables_refuse_wrong_values_by_name(tmp_path, table: str, wrong: str,
                                                    names: str) -> None:
    """A wrong tunable is a one-line ConfigError naming it, not a traceback at first use."""
    from gateway.outbound.delivery import RetryPolicy
    from gateway.pipeline.worker import WorkerConfig
    from gateway.security.brute import BruteSettings

    path = tmp_path / "gateway.toml"
    path.write_text(f"[{table}]\n{wrong}\n[pipeline.handlers]\n")
    settings = load_settings({"GATEWAY_CONFIG": str(path)})
    readers = {"pipeline": WorkerConfig.from_settings, "outbound": RetryPolicy.from_settings,
               "security": lambda s: BruteSettings.from_section(s.section("security"))}
    with pytest.raises(ConfigError) as info:
        readers[table](settings)
    assert names in str(info.value)


def test_tunable_tables_read_their_values(tmp_path) -> None:
    from gateway.outbound.delivery import RetryPolicy
    from gateway.pipeline.worker import WorkerConfig
    from gateway.security.brute import BruteSettings

    path = tmp_path / "gateway.toml"
    path.write_text("[pipeline]\nbatch = 3\nbackoff_seconds = 0.5\n[pipeline.handlers]\n"
                    "[outbound]\nattempts = 2\n"
                    '[security]\nbrute_window = 5\ntrusted_proxies = ["10.0.0.0/8"]\n')
    settings = load_settings({"GATEWAY_CONFIG": str(path)})
    worker = WorkerConfig.from_settings(settings)
    assert (worker.batch, worker.backoff, worker.backoff_cap) == (3, 0.5, 300.0)
    assert RetryPolicy.from_settings(settings).attempts == 2
    brute = BruteSettings.from_section(settings.section("security"))
    assert brute.window == 5 and str(brute.trusted_proxies[0]) == "10.0.0.0/8"
