"""Reporting: tables, pages, plots and traces over a store of runs.

Owns the report (`report`: tables in md/latex/csv/html), its HTML page (`report_page`),
the plots (`plots`, drawing what `plot_data` computes), the Perfetto trace export
(`trace`) and the listings of workloads and trainers (`listing`). Reads stores; starts nothing.

May import: the top-level leaves and every group below it (measurement .. scaling).
"""
