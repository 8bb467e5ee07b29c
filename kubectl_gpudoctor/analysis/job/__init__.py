"""`job NAME`: which node (or rank) holds up a multi-node GPU job.

Why a package: a job is one question with several parts -- which kind of object the name is
and how its pods are found (kinds.py), how its nodes compare with each other (nodes.py), how
its ranks compare (ranks.py), and the answer (verdict.py). Pure functions over raw API dicts,
as the rest of analysis/; commands/job.py fetches.
"""
