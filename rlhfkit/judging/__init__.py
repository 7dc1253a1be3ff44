"""A local causal LM as the judge of replies: RLAIF's pairwise labels (`rlhfkit judge`, `rlhfkit iterate --judge
model:PATH`) and Constitutional AI's critique-and-revise stage (`rlhfkit revise`).

    prompts.py    the principles and the texts the judging and revising model is asked
    pairs.py      input rows -> pairs, checked before any model loads
    model.py      the judge: next-token probabilities of the choice labels, both orders, the decision
    agreement.py  the judge against people's labels of the same pairs (pure Python)
    run.py        `rlhfkit judge`
    revise.py     `rlhfkit revise`
"""
