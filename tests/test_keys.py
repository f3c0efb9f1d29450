import subprocess
import sys

import pytest

from gateway import keys


def test_every_builder_lands_in_a_registry_row() -> None:
    built = {
        keys.q("ready", "store"): "q:",
        keys.rl("telegram", "chat", 1): "rl:",
        keys.brute("ip", "1.2.3.4"): "brute:",
        keys.lock("mattermost-listener"): "lock:",
        keys.dedup_webhook("src", "msg_1"): "dedup:webhook:",
        keys.dedup_webhook_body("gh", "ab" * 32): "dedup:webhook-body:",
        keys.dedup_slack_event("Ev1"): "dedup:slack-event:",
        keys.dedup_telegram_update(42, 7): "dedup:telegram-update:",
        keys.dedup_job("j1"): "dedup:job:",
        keys.dedup_mattermost_post("p1"): "dedup:mattermost-post:",
        keys.cache("search", "abc"): "cache:",
        keys.mattermost_listener(): "cache:mattermost:listener",
        keys.telegram_active_conv(5): "telegram:active-conv:",
        keys.slack_active_conv("T", "C", "1.2"): "slack:active-conv:",
        keys.mattermost_active_conv("ch"): "mattermost:active-conv:",
        keys.push_channel("pipeline"): "push:",
    }
    for key, namespace in built.items():
        row = keys.row_for(key)
        assert row is not None and row.namespace == namespace, key


def test_pipeline_keys_share_one_hash_tag() -> None:
    assert keys.q("ready", "store").startswith("q:{pipeline}:")
    assert keys.q("dead", "graph").startswith("q:{pipeline}:")


def test_unknown_key_has_no_row() -> None:
    assert keys.row_for("queue:store") is None
    assert keys.row_for("dedup:other:1") is None


def test_cache_rows_must_expire() -> None:
    for row in keys.REGISTRY:
        if row.instance == "cache" and row.kind == "key":
            assert row.must_expire


def test_empty_key_parts_are_refused() -> None:
    with pytest.raises(ValueError):
        keys.cache()


def test_gateway_keys_prints_namespace_first() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "keys"], capture_output=True,
                         text=True, check=True, timeout=60).stdout.splitlines()
    assert [line.split()[0] for line in out] == [row.namespace for row in keys.REGISTRY]
    assert all(line.split()[1] in ("durable", "cache") for line in out)
