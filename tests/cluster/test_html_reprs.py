"""End-to-end: the notebook views (``_repr_html_``) and one-line texts of a cluster, a session,
tensors, a mesh and sharded tensors, parsed by a real HTML parser, checked against their
objects, and never a cause of a read or a token on show."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)

# Elements HTML closes by itself (none of them may be closed by a tag)
VOID = {"br", "hr", "img", "input", "meta", "link", "col", "area", "base", "wbr"}


class Checked(HTMLParser):
    """A parse of one repr that fails on a tag closed out of order or left open, and keeps
    the text of each table row (label -> value) and every other text."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.tags: list[str] = []
        self.texts: list[str] = []
        self.feed(markup)
        self.close()
        assert self.open == [], f"left open: {self.open}"
        cells = iter(self.texts)
        self.rows = {label: value for label, value in zip(cells, cells)}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]}"
        self.open.pop()

    def handle_data(self, data: str) -> None:
        # (only the cells of the fields' table: label, value, label, value ...)
        if self.open[-1:] in (["th"], ["td"]):
            self.texts.append(data)


def parsed(thing: Any) -> Checked:
    markup = thing._repr_html_()
    assert markup.startswith('<div class="fabric-repr">')
    return Checked(markup)


def reads(session: Any) -> tuple[int, int]:
    stats = session.stats()
    return stats["reads"], stats["bytes_read"]


def test_every_view_is_well_formed_says_its_fields_and_reads_nothing(cluster):
    with cluster.connect(device=0) as session:
        values = np.arange(24, dtype=np.float32).reshape(4, 6) + 0.375  # (findable)
        held = session.asarray(values)
        other = session.zeros((1000,), dtype="int64")
        view = held[1:3]  # (a view: counted as held, its bytes its base's)
        mesh = session.mesh(devices=[0, 1])
        split = mesh.asarray(np.full((7, 3, 2), 0.625), axis=0)
        replicated = mesh.asarray(np.ones(5), axis=None)
        combined = split.sum(axis=0)  # (partials on each device, combined when read)
        before = reads(session), [reads(s) for s in mesh.sessions]

        shown = parsed(cluster)
        assert shown.rows["address"] == cluster.address
        assert shown.rows["state"] == "running"
        assert shown.rows["workers"] == "2 of 2 running"
        assert shown.rows["devices"] == "2 numpy (1 per worker)"
        assert repr(cluster) == (f"<fabric.LocalCluster address={cluster.address} "
                                 "state=running workers=2 of 2 running "
                                 "devices=2 numpy (1 per worker)>")

        shown = parsed(session)
        assert shown.rows == {
            "id": f"{session.id:#x}", "address": cluster.address, "device": "0",
            "backend": "numpy", "worker": session.device.worker, "state": "open",
            "tensors": "3", "bytes": "7.9 KiB"}  # (96 B and 8000 B; the view's none)
        assert repr(session) == (f"<fabric.Session id={session.id:#x} address={cluster.address}"
                                 f" device=0 backend=numpy worker={session.device.worker} "
                                 "state=open>")  # (no tensors: a repr lands in errors)

        shown = parsed(held)
        assert shown.rows == {"shape": "(4, 6)", "dtype": "float32", "device": "0 (numpy)",
                              "bytes": "96 B", "session": f"{session.id:#x}"}
        assert held.describe() == (f"<fabric.Tensor shape=(4, 6) dtype=float32 "
                                   f"device=0 (numpy) bytes=96 B session={session.id:#x}>")
        assert parsed(view).rows["shape"] == "(2, 6)"

        shown = parsed(mesh)
        assert shown.rows == {"devices": "[0, 1]", "backends": "['numpy', 'numpy']",
                              "state": "open"}
        assert "svg" in shown.tags and shown.tags.count("rect") == 2

        shown = parsed(split)
        assert shown.rows["shape"] == "(7, 3, 2)" and shown.rows["bytes"] == "336 B"
        assert shown.rows["sharding"] == "split along axis 0 in blocks [4, 3] on devices [0, 1]"
        assert shown.tags.count("rect") == 2
        markup = split._repr_html_()
        assert "device 0: [0, 4)" in markup and "device 1: [4, 7)" in markup
        assert "axis 0 (7) across, axis 1 (3) down" in markup

        shown = parsed(replicated)
        assert shown.rows["sharding"] == "replicated on devices [0, 1]"
        assert shown.tags.count("rect") == 2

        shown = parsed(combined)
        assert shown.rows["shape"] == "(3, 2)" and "svg" not in shown.tags
        assert combined._shards is None  # (showing it made no shard: that would read)

        for thing in (held, view, other, split, replicated, combined):
            assert "fabric.Tensor" in thing.describe() or "ShardedTensor" in thing.describe()
        after = reads(session), [reads(s) for s in mesh.sessions]
        assert after == before  # no view read a value

        text = "".join(t._repr_html_() for t in (cluster, session, held, view, mesh, split))
        for secret in (cluster.token, cluster.admin_token, cluster.worker_token):
            assert secret not in text and secret not in repr(cluster) + repr(session)
        assert "0.375" not in text and "0.625" not in text  # (no values shown)


def test_a_closed_session_shows_it(cluster):
    session = cluster.connect(device=1)
    session.close()
    shown = parsed(session)
    assert shown.rows["state"] == "closed" and shown.rows["tensors"] == "0"
    assert repr(session).endswith("state=closed>")
