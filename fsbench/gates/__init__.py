"""Gates: is NEW slower than BASE, with evidence, or say that it cannot tell.

Owns the comparison of two stores (`compare`, reading the sides: `compare_sides`, its
tables: `compare_output`; the statistics are fsbench.stats, shared with reports), the
two-version gate over git worktrees (`gate`), the search for the first bad commit
(`bisect`), the history of a metric over commits (`history`) and the deterministic reference gates
(`reference`).

May import: the top-level leaves and every group below it (measurement .. reporting).
"""
