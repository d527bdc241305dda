"""The notebook views' building blocks (``fabric.arrays.html_repr``), sans I/O: escaping,
the one-line text, sizes and the SVG of blocks."""

from __future__ import annotations

from fabric.arrays.html_repr import blocks_svg, byte_text, devices_svg, one_line, table


def test_every_string_is_escaped():
    markup = table("<K>", [("a<b", "<script>&'\"")], devices_svg(["<d>"]))
    assert "<script>" not in markup and "<K>" not in markup and "<d>" not in markup
    assert "&lt;script&gt;&amp;&#x27;&quot;" in markup and "a&lt;b" in markup


def test_the_text_says_what_the_table_says():
    fields = [("shape", (2, 3)), ("tensors held", 4)]
    assert one_line("Thing", fields) == "<fabric.Thing shape=(2, 3) tensors_held=4>"
    assert all(str(value) in table("Thing", fields) for _, value in fields)


def test_sizes_read_as_a_person_reads_them():
    assert [byte_text(n) for n in (0, 1023, 1024, 1536 << 10, 3 << 40, 5 << 50)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 MiB", "3.0 TiB", "5120.0 TiB"]


def test_one_rectangle_per_block_labelled_with_its_device_and_extent():
    svg = blocks_svg((10, 4, 3), 1, (2, 2, 0), (5, 0, 3))
    assert svg.count("<rect") == 3
    assert all(label in svg for label in ("device 5: [0, 2)", "device 0: [2, 4)",
                                          "device 3: [4, 4)"))
    assert "axis 1 (4) across, axis 0 (10) down" in svg
    assert blocks_svg((6,), 0, (3, 3), (0, 1)).count("<rect") == 2  # (1-d: one axis)
    assert blocks_svg((0, 0), 0, (0, 0), (0, 1)).count("<rect") == 2  # (empty: still drawn)
    assert blocks_svg((4,), None, (), (0, 1, 2)).count("whole array") == 6  # (title, text)
