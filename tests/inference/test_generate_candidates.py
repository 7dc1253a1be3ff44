"""`rlhfkit generate --num-samples K`: K responses per prompt, the candidates `rlhfkit label` reads."""

from __future__ import annotations

from rlhfkit.labelling.items import read_pairs
from tests.helpers import read_jsonl, run_cli, write_jsonl


def test_k_samples_per_prompt_are_written_as_a_responses_list(tiny_model_dir, tmp_path, capsys):
    prompts = [{"prompt": "Question: what does alice want? Answer:", "id": 0}]
    prompts.append({"prompt": [{"role": "user", "content": "please give bob the hat"}], "id": 1})
    data = write_jsonl(tmp_path / "prompts.jsonl", prompts)
    out = tmp_path / "candidates.jsonl"
    args = ["generate", "--model", tiny_model_dir, "--data", data, "--output", out, "--max-new-tokens", 8]
    code, _, err = run_cli(capsys, *args, "--num-samples", 3, "--batch-size", 4)
    assert code == 0 and "wrote 6 responses (2 prompts x 3)" in err
    rows = read_jsonl(out)
    assert [list(r) for r in rows] == [["prompt", "responses", "id"]] * 2
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in prompts]
    assert all(len(r["responses"]) == 3 and all(isinstance(t, str) for t in r["responses"]) for r in rows)
    assert len({t for r in rows for t in r["responses"]}) > 1  # sampled, not one text repeated
    # label reads them: K = 3 responses give the 3 pairs of a cycle, less any of identical texts
    pairs = read_pairs(str(out))
    assert 1 <= len(pairs) <= 6 and {p.source.split(" (")[0] for p in pairs} <= {f"{out}: line 1", f"{out}: line 2"}


def test_num_samples_must_be_positive(tiny_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "hi"}])
    code, _, err = run_cli(
        capsys,
        "generate",
        "--model",
        tiny_model_dir,
        "--data",
        data,
        "--output",
        tmp_path / "o.jsonl",
        "--num-samples",
        0,
    )
    assert code == 1 and "--num-samples must be > 0, got 0" in err
