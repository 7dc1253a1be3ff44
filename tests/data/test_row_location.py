"""A row found bad after reading is named as reading names it: ``line N`` of a JSONL file, ``row N`` otherwise."""

from __future__ import annotations

import json

from rlhfkit.data.readers import read_rows, row_location
from rlhfkit.errors import UserError


def test_row_location_matches_the_readers_own_wording(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n   \n{"prompt": "c"}\n')  # blank lines in between
    rows = read_rows(jsonl)
    assert [row_location(jsonl, i) for i in range(3)] == [row.where() for row in rows]
    assert row_location(jsonl, 2) == f"{jsonl}: line 5"
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b"}]))
    assert [row_location(listed, i) for i in range(2)] == [row.where() for row in read_rows(listed)]
    assert row_location(listed, 1) == f"{listed}: row 2"


def test_an_environment_error_names_the_line(tmp_path):
    from rlhfkit.multiturn.envs import EnvCaller

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    error = EnvCaller(object, str(data)).fail(1, "step", RuntimeError("boom"))
    assert isinstance(error, UserError)
    assert str(error) == f"{data}: line 3: environment object.step raised RuntimeError: boom"
