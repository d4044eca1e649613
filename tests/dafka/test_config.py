"""Dafka config: zconfig-like paths, spec §7 defaults, ZPL files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backends.dafka.config import DEFAULTS, Config, ConfigError

SPEC_EXAMPLE = """\
beacon
    sub_address = tcp://10.0.0.5:5556
    pub_address = tcp://10.0.0.5:5557
consumer
    offset
        reset = earliest
store
    db = /var/lib/dafka/storedb
"""


def test_defaults_come_from_the_spec_table() -> None:
    config = Config()
    assert config.get("producer/head_interval") == "1000"
    assert config.get_int("producer/high_watermark") == 1_000_000
    assert config.get("consumer/offset/reset") == "latest"
    assert config.get("beacon/sub_address") == "tcp://127.0.0.1:5556"
    assert config.get("beacon/pub_address") == "tcp://127.0.0.1:5557"
    assert config.get("tower/pub_address") == "tcp://*:5557"
    assert config.get_int("beacon/ready_timeout") == 10_000
    assert config.get("beacon/address") == ""
    assert config.get("no/such/key") == ""
    assert config.get("no/such/key", "fallback") == "fallback"
    assert config.get_int("no/such/key", 7) == 7


def test_readme_documents_the_defaults_of_the_settings_beyond_c() -> None:
    """Each row `| `key` | default | ...` of the README's settings table matches DEFAULTS,
    and every issue-7 setting has a row (a changed default cannot go undocumented)."""
    readme = Path(__file__).parents[2] / "backends" / "dafka" / "README.md"
    rows = dict(re.findall(r"^\| `([a-z_/]+)` \| (-?\d+) \|", readme.read_text(), re.MULTILINE))
    issue7 = {
        "producer/subscribe_settle",
        "producer/close_timeout",
        "consumer/heads_interval",
        "store/push_heads/interval",
        "store/push_heads/duration",
    }
    assert issue7 <= rows.keys()
    assert rows == {key: DEFAULTS[key] for key in rows}


def test_set_overrides_and_values_are_strings() -> None:
    config = Config({"beacon/interval": 50})
    config.set("producer/verbose", 1)
    assert config.get("beacon/interval") == "50"
    assert config.get_int("beacon/interval", 9) == 50  # a set value beats the default argument
    assert config.get_bool("producer/verbose")
    assert not config.get_bool("store/verbose")
    assert config.has("beacon/interval")
    assert not config.has("beacon/timeout")


def test_get_int_names_the_key_on_garbage() -> None:
    config = Config({"beacon/interval": "soon"})
    with pytest.raises(ConfigError, match="beacon/interval = 'soon' is not an integer"):
        config.get_int("beacon/interval")


def test_invalid_paths_are_refused() -> None:
    with pytest.raises(ConfigError, match="invalid config path"):
        Config().set("a//b", "x")
    with pytest.raises(ConfigError, match="invalid config path"):
        Config().get("bad key")


def test_spec_zpl_example_loads() -> None:
    config = Config.from_zpl(SPEC_EXAMPLE)
    assert config.get("beacon/sub_address") == "tcp://10.0.0.5:5556"
    assert config.get("consumer/offset/reset") == "earliest"
    assert config.get("store/db") == "/var/lib/dafka/storedb"
    assert not config.has("consumer/offset")  # a node without a value


def test_zpl_comments_quotes_and_node_values() -> None:
    text = (
        "# header comment\n"
        "\n"
        "producer = top   # a node with a value and children\n"
        "    verbose = 1\n"
        '    name = "a # not a comment"\n'
        "    other = 'say \"hi\"'  # comment\n"
        '    empty = ""\n'
        "    bare = value with spaces\n"
    )
    config = Config.from_zpl(text)
    assert config.get("producer") == "top"
    assert config.get("producer/verbose") == "1"
    assert config.get("producer/name") == "a # not a comment"
    assert config.get("producer/other") == 'say "hi"'
    assert config.get("producer/empty") == ""
    assert config.get("producer/bare") == "value with spaces"


def test_zpl_round_trip() -> None:
    config = Config.from_zpl(SPEC_EXAMPLE)
    config.set("producer", "x")
    config.set("producer/quote", 'has "double"')
    text = config.to_zpl()
    assert text.startswith('beacon\n    sub_address = "tcp://10.0.0.5:5556"\n')
    assert Config.from_zpl(text) == config


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a\n      b = 1\n", "<zpl>:2: indentation must be a multiple of 4"),
        ("a\n        b = 1\n", "<zpl>:2: indented too far"),
        ("    a = 1\n", "<zpl>:1: indented too far"),
        ("a\n\tb = 1\n", "<zpl>:2: tabs are not allowed"),
        ("a b\n", "<zpl>:1: expected '=' or end of line after 'a'"),
        ("= 1\n", "<zpl>:1: expected a name"),
        ('a = "open\n', '<zpl>:1: missing closing "'),
        ('a = "x" y\n', "<zpl>:1: unexpected text after the quoted value"),
    ],
)
def test_malformed_zpl_names_the_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_zpl(text)
    assert str(info.value).startswith(error)


def test_load_and_save_files(tmp_path: Path) -> None:
    path = tmp_path / "dafka.cfg"
    path.write_text(SPEC_EXAMPLE)
    config = Config.load(path)
    assert config.get("store/db") == "/var/lib/dafka/storedb"
    config.save(tmp_path / "copy.cfg")
    assert Config.load(tmp_path / "copy.cfg") == config
    (tmp_path / "bad.cfg").write_text("ok\n   wrong\n")
    with pytest.raises(ConfigError, match=r"bad\.cfg:2: indentation"):
        Config.load(tmp_path / "bad.cfg")
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.cfg"):
        Config.load(tmp_path / "missing.cfg")


def test_zpl_cannot_hold_both_quotes_or_newlines() -> None:
    with pytest.raises(ConfigError, match="both quote kinds"):
        Config({"a": "'\""}).to_zpl()
    with pytest.raises(ConfigError, match="line break"):
        Config({"a": "x\ny"}).to_zpl()


def test_zpl_groups_paths_under_their_parents_whatever_the_order() -> None:
    config = Config({"store/retention/ms": "1", "beacon/address": "127.0.0.1"})
    config.set("store/db", "/data/db")  # set after another section was written
    text = config.to_zpl()
    assert Config.from_zpl(text).get("store/db") == "/data/db", text
    assert Config.from_zpl(text) == config
