"""Unit: the connection file (for users) and the admin file (for operators), written and read
by ``fabric.core.config``, and which file ``fabric.Admin`` reads. No processes, no sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric.client.admin import resolve_target
from fabric.core.config import (
    admin_file_beside,
    default_admin_file,
    default_connection_file,
    load_admin_file,
    load_connection_file,
    write_admin_file,
    write_connection_file,
    write_secret_file,
)
from fabric.core.errors import ConfigError

CURVE = {"secret_key_file": "/keys/client.key_secret", "server_public_key_file": "/keys/broker.key"}
CLUSTER = {"address": "tcp://127.0.0.1:5555", "worker_address": "tcp://127.0.0.1:5556",
           "token": "client-secret", "admin_token": "admin-secret",
           "worker_token": "worker-secret", "curve": CURVE}


@pytest.fixture
def no_fabric_env(monkeypatch, tmp_path):
    """No FABRIC_ variables, and default files under an empty config directory."""
    for name in ("FABRIC_CONNECTION_FILE", "FABRIC_ADMIN_FILE", "FABRIC_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return monkeypatch


def written(path: Path) -> dict:
    assert path.stat().st_mode & 0o777 == 0o600
    return json.loads(path.read_text())


def test_the_connection_file_holds_what_a_client_needs_and_no_other_token(tmp_path):
    path = write_connection_file(tmp_path / "new" / "cluster.json", CLUSTER)
    assert written(path) == {"address": CLUSTER["address"], "token": "client-secret",
                             "curve": CURVE}
    assert load_connection_file(path) == {**written(path), "path": str(path)}


def test_the_admin_file_holds_the_operators_tokens_and_not_the_clients(tmp_path):
    path = write_admin_file(tmp_path / "cluster-admin.json", CLUSTER)
    assert written(path) == {"address": CLUSTER["address"],
                             "worker_address": CLUSTER["worker_address"],
                             "admin_token": "admin-secret", "worker_token": "worker-secret",
                             "curve": CURVE}
    assert load_admin_file(path)["admin_token"] == "admin-secret"
    with pytest.raises(ConfigError, match="the operators' admin file, not a connection file"):
        load_connection_file(path)


def test_an_admin_file_from_an_older_release_gives_its_backend_address_as_worker_address(
        tmp_path):
    old = {k: v for k, v in CLUSTER.items() if k not in ("token", "worker_address")}
    path = tmp_path / "old-admin.json"
    write_secret_file(path, json.dumps({**old, "backend_address": "tcp://127.0.0.1:5556"}))
    info = load_admin_file(path)
    assert info["worker_address"] == "tcp://127.0.0.1:5556" and "backend_address" not in info
    # A file that names both (written by hand): the new name wins.
    write_secret_file(path, json.dumps({**old, "backend_address": "tcp://old:1",
                                        "worker_address": "tcp://new:1"}))
    assert load_admin_file(path)["worker_address"] == "tcp://new:1"


def test_files_without_curve_keys_name_none(tmp_path):
    plain = {**CLUSTER, "curve": None}
    assert "curve" not in written(write_connection_file(tmp_path / "c.json", plain))
    assert "curve" not in written(write_admin_file(tmp_path / "a.json", plain))


def test_an_older_file_with_every_token_is_read_by_clients_and_admins(tmp_path):
    path = tmp_path / "old.json"
    write_secret_file(path, json.dumps({k: v for k, v in CLUSTER.items() if k != "curve"}))
    assert load_connection_file(path)["token"] == "client-secret"
    assert load_admin_file(path)["admin_token"] == "admin-secret"


def test_an_admin_file_that_is_not_one_is_refused_saying_so(tmp_path):
    for name, content in [("garbage.json", "{not json"),
                          ("noaddress.json", json.dumps({"admin_token": "a"})),
                          ("number.json", json.dumps({"address": "tcp://h:1", "admin_token": 7}))]:
        write_secret_file(tmp_path / name, content)
        with pytest.raises(ConfigError, match="is not a fabric admin file"):
            load_admin_file(tmp_path / name)


def test_the_admin_file_is_written_beside_the_connection_file_by_default(no_fabric_env):
    assert admin_file_beside("/run/fabric/conn.json") == Path("/run/fabric/conn-admin.json")
    assert admin_file_beside("/run/fabric/conn") == Path("/run/fabric/conn-admin.json")
    assert default_admin_file() == default_connection_file().with_name("cluster-admin.json")


# -- which file fabric.Admin reads ----------------------------------------------------------


def test_admin_reads_the_admin_file_named_first_then_the_environment_then_defaults(
        no_fabric_env, tmp_path):
    admin_file = write_admin_file(tmp_path / "a.json", CLUSTER)
    other = write_admin_file(tmp_path / "b.json", {**CLUSTER, "address": "tcp://other:1"})
    assert resolve_target(None, None, admin_file) == (
        CLUSTER["address"], "admin-secret", str(admin_file), CURVE)
    # The admin file's variable wins over the connection file's; either over a default.
    write_admin_file(default_admin_file(), {**CLUSTER, "address": "tcp://default:1"})
    no_fabric_env.setenv("FABRIC_CONNECTION_FILE", str(other))
    assert resolve_target(None, None, None)[0] == "tcp://other:1"
    no_fabric_env.setenv("FABRIC_ADMIN_FILE", str(admin_file))
    assert resolve_target(None, None, None)[0] == CLUSTER["address"]
    no_fabric_env.delenv("FABRIC_ADMIN_FILE")
    no_fabric_env.delenv("FABRIC_CONNECTION_FILE")
    assert resolve_target(None, None, None)[0] == "tcp://default:1"


def test_admin_given_a_clients_file_needs_the_admin_token_from_elsewhere(no_fabric_env,
                                                                          tmp_path):
    client_file = write_connection_file(tmp_path / "cluster.json", CLUSTER)
    with pytest.raises(ConfigError, match="client's connection file: it holds no admin token"):
        resolve_target(None, None, None, client_file)
    no_fabric_env.setenv("FABRIC_ADMIN_TOKEN", "admin-secret")
    assert resolve_target(None, None, None, client_file)[:2] == (CLUSTER["address"],
                                                                  "admin-secret")


def test_admin_refuses_two_files_at_once(no_fabric_env, tmp_path):
    admin_file = write_admin_file(tmp_path / "a.json", CLUSTER)
    with pytest.raises(ConfigError, match="not both"):
        resolve_target(None, None, admin_file, admin_file)
