"""Memory you can test on your own data: `picoclaw memory eval`.

- cases.py: a case (a question and the text that identifies its answer), case files read and written.
- targets.py: every entry of a scope with its document and age; where an expect lives, or that it is gone.
- retrieval.py: the search an eval scores and `memory search` prints (one function), under a given policy.
- run.py: the run and its figures (recall@1/@3/@K, mean rank, by document and age, misses, time per query).
- run_log.py: the log of runs under the policy in force (the last figures and their trend).
- generate.py: cases the model writes from chosen entries, and the checks each must pass.
- past_turns.py: cases from past turns whose reply came from the memory the turn carried.
- case_set.py: a workspace's eval set (saved cases and past turns).
- answers.py, answer_scoring.py: end-to-end answers, token F1 and the optional judge.
- policy_check.py: a policy change tried against the eval before it applies.
"""
