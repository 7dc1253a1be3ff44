"""docs/generation.md's table of the own sampler against a colocated vLLM engine (bench/vllm_engine.py,
bench/reported/vllm_engine.json). Standard library only."""

from __future__ import annotations

from table_parts import AVX2, Run, sources, table

# The run the table shows (machine key, run key).
VLLM_RUN = (AVX2, "78314bf37071 --steps 3")


def vllm_engine(where: tuple[str, str] = VLLM_RUN) -> list[str]:
    """Per command and sampler, the median over a run's steps 2..N of: sampling (the sampling phase less the
    engine's weight load), the weight load, the whole step, and the engine's log-probs' mean gap to the
    trainer's."""
    run = Run("vllm_engine", *where)
    rows = []
    for r in run["results"]:
        sync = r["weight_sync_s"]
        rows.append(
            [
                r["command"],
                r["sampler"],
                f"{r['sample_s'] - (sync or 0.0):.2f}",
                "-" if sync is None else f"{sync:.2f}",
                f"{r['step_s']:.2f}",
                "-" if r["logprob_diff"] is None else f"{r['logprob_diff']:.1e}",
            ]
        )
    header = ["command", "sampler", "sampling s", "weight sync s", "step s", "engine / trainer log-prob gap"]
    return [*table(header, rows), "", sources(run)]
