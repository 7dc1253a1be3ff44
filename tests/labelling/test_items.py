"""Which pairs a candidates file gives."""

from __future__ import annotations

from rlhfkit.labelling.items import pair_indices, read_pairs
from tests.helpers import write_jsonl


def test_pairs_of_k_responses_cycle_or_all():
    assert pair_indices(2, "cycle") == pair_indices(2, "all") == [(0, 1)]
    assert pair_indices(4, "cycle") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert pair_indices(4, "all") == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_candidate_and_preference_rows_and_identical_texts(tmp_path):
    rows = [
        {"prompt": "p1", "responses": ["a", "b", "c"]},
        {"prompt": "p2", "chosen": "good", "rejected": "bad", "margin": 2},
        {"chosen": "User: hi\nAssistant: hello", "rejected": "User: hi\nAssistant: go away"},
        {"prompt": "p4", "responses": ["same", "same"]},
    ]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    pairs = read_pairs(str(path))
    assert [(p.prompt, p.x, p.y) for p in pairs] == [
        ("p1", "a", "b"),
        ("p1", "b", "c"),
        ("p1", "c", "a"),
        ("p2", "good", "bad"),
        ("User: hi\nAssistant:", " hello", " go away"),
    ]
    assert pairs[1].source == f"{path}: line 1 (responses 2 and 3)" and pairs[3].source == f"{path}: line 2"
