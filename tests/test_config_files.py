"""Config files as tcnn reads them (nlohmann's JSON with comments): ``//``, ``#`` and ``/* */`` comments and a UTF-8
byte-order mark accepted, read in time linear in the file's size; every error a ``ValueError`` naming the file, the
line, the column and the character; nesting bounded with a clear message."""
import json
import time

import pytest

import tinn
from tinn.registry import MAX_CONFIG_DEPTH

CONFIG = {"encoding": {"otype": "HashGrid", "n_levels": 4}, "network": {"otype": "FullyFusedMLP", "n_neurons": 16},
          "optimizer": {"otype": "Adam", "learning_rate": 0.01, "betas": [0.9, 0.99]}, "loss": {"otype": "L2"}}


def load(tmp_path, text, name="c.json"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return tinn.load_config(path), path


@pytest.mark.parametrize("commented", [
    '// a config\n{"encoding": {"otype": "HashGrid", # the grid\n "n_levels": 4}, /* a block\n comment */ '
    '"network": {"otype": "FullyFusedMLP", "n_neurons": 16,},\n "optimizer": {"otype": "Adam", "learning_rate": 0.01, '
    '"betas": [0.9, 0.99, /* , ] */]}, "loss": {"otype": "L2"}}',
    '\ufeff' + json.dumps(CONFIG),
    '/**/{"encoding": {"otype": "HashGrid", "n_levels": 4}, "network": {"otype": "FullyFusedMLP", "n_neurons": 16}, '
    '"optimizer": {"otype": "Adam", "learning_rate": 0.01, "betas": [0.9, 0.99]}, "loss": {"otype": "L2"}}/* end */',
], ids=["comments-and-trailing-commas", "byte-order-mark", "block-comments"])
def test_comments_a_byte_order_mark_and_trailing_commas_read_as_plain_json(tmp_path, commented):
    assert load(tmp_path, commented)[0] == CONFIG


def test_comment_markers_inside_strings_are_text(tmp_path):
    text = '{"a": "x // y", "b": "# z", "c": "/* w */", "d": "q\\" // r"}'
    assert load(tmp_path, text)[0] == {"a": "x // y", "b": "# z", "c": "/* w */", "d": 'q" // r'}


@pytest.mark.parametrize("text, line, column, char", [
    ("root:x:0:0:root:/root:/bin/bash\n", 1, 1, "'r'"),
    ('{\n  "a": NaN\n}', 2, 8, "'N'"),
    ('{\n  "a": 1, // c\n  "b": -Infinity}', 3, 8, "'-'"),
    ('{"a": 1 /* never closed', 1, 9, "'/'"),
    ('{\n  "a": [1, 2 3]\n}', 2, 14, "'3'"),
    ('{"a": ', 1, 7, None),
])
def test_a_bad_character_is_named_with_its_file_line_and_column(tmp_path, text, line, column, char):
    with pytest.raises(ValueError) as err:
        load(tmp_path, text)
    msg = str(err.value)
    where = f"c.json: invalid JSON at line {line}, column {column}: "
    assert where in msg, msg
    assert (f"unexpected character {char}" if char else "unexpected end of file") in msg, msg


@pytest.mark.parametrize("raw, line, column, byte", [("caf\u00e9".encode("latin-1"), 1, 4, "0xe9"),
                                                     ('{"a": 1}'.encode("utf-16"), 1, 1, "0xff"),
                                                     (b'{\n"x": "\xc3"}', 2, 7, "0xc3")])
def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path, raw, line, column, byte):
    with pytest.raises(ValueError, match=rf"c\.json: not UTF-8 text: byte {byte} at line {line}, column {column}"):
        load(tmp_path, raw)


@pytest.mark.parametrize("text", ["[" * 2000, "[" * 2000 + "]" * 2000, '{"a":' * 2000 + "1" + "}" * 2000,
                                  "// deep\n" + "[" * (MAX_CONFIG_DEPTH + 1) + "]" * (MAX_CONFIG_DEPTH + 1)])
def test_deep_nesting_is_refused_with_a_clear_message(tmp_path, text):
    with pytest.raises(ValueError, match=rf"c\.json: invalid JSON: JSON nested more than {MAX_CONFIG_DEPTH} deep"):
        load(tmp_path, text)


def test_nesting_up_to_the_limit_reads():
    depth = MAX_CONFIG_DEPTH - 1
    config = tinn.registry.parse_json("// c\n" + "[" * depth + "]" * depth, "inline")
    for _ in range(depth - 1):
        config = config[0]
    assert config == []


def test_deeply_nested_optimizer_dicts_are_refused_with_a_clear_message():
    config = {"otype": "Adam"}
    for _ in range(600):
        config = {"otype": "EMA", "nested": config}
    with pytest.raises(ValueError, match=f"optimizer config nests dicts and lists more than {MAX_CONFIG_DEPTH} deep"):
        tinn.create_optimizer(config)
    assert tinn.create_optimizer({"otype": "EMA", "nested": {"otype": "Lookahead", "nested": {}}}).otype == "EMA"


def test_a_large_commented_file_reads_in_linear_time(tmp_path):
    """2 MB of numbers after a comment (commentjson's reconstructor took 23 GB and minutes on this; the bound is
    loose for a loaded machine: a quadratic parser misses it by orders of magnitude)."""
    values = list(range(300_000))
    text = '// two megabytes\n{"values": [' + ", ".join(map(str, values)) + "]}"
    assert len(text) > 2_000_000
    start = time.perf_counter()
    config, _ = load(tmp_path, text)
    assert time.perf_counter() - start < 10
    assert config["values"] == values
