"""Direct tests for sharedmem.install.codex_toml: the table text, and edits that touch only our table."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sharedmem.core import InstallError
from sharedmem.install import codex_toml

CMD = ["/opt/py thon", "-m", 'say "hi"\t\x01\\']
PATH = Path("config.toml")
OTHER = '# keep me\nmodel = "o3"\n\n[mcp_servers.other]\ncommand = "x"\n'


def test_table_round_trips_through_tomllib_with_escapes():
    text = codex_toml.table("srv", CMD)
    assert text.startswith("[mcp_servers.srv]\n")
    assert codex_toml.server_entry(tomllib.loads(text), "srv") == codex_toml.entry(CMD)
    assert codex_toml.table("srv", CMD, "\r\n").count("\r\n") == 4


def test_add_then_remove_restores_the_original_bytes():
    added = codex_toml.edit(PATH, OTHER, "srv", CMD)
    assert added.startswith(OTHER)
    data = tomllib.loads(added)
    assert data["mcp_servers"]["other"] == {"command": "x"}
    assert codex_toml.server_entry(data, "srv") == codex_toml.entry(CMD)
    assert codex_toml.edit(PATH, added, "srv", None) == OTHER


def test_update_in_place_keeps_crlf_and_drops_our_sub_tables():
    text = ('a = 1\r\n[mcp_servers.srv]\r\ncommand = "old"\r\n[mcp_servers.srv.env]\r\nK = "v"\r\n'
            '# trailing comment stays\r\n[b]\r\nc = 2\r\n')
    result = codex_toml.edit(PATH, text, "srv", CMD)
    assert result == ("a = 1\r\n" + codex_toml.table("srv", CMD, "\r\n")
                      + "# trailing comment stays\r\n[b]\r\nc = 2\r\n")


def test_inline_definition_and_invalid_toml_are_refused():
    inline = 'mcp_servers = { srv = { command = "x" } }\n'
    with pytest.raises(InstallError, match="nothing was written: add this table by hand"):
        codex_toml.edit(PATH, inline, "srv", CMD)
    with pytest.raises(InstallError, match="config.toml is not valid TOML"):
        codex_toml.load(PATH, "a = \n")
    assert codex_toml.server_entry({"mcp_servers": "nope"}, "srv") is None
