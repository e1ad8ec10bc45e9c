"""The evaluation benchmark's parts; ``benchmarks/evaluate.py`` is its entry point.

* :mod:`~benchmarks.evaluation.cases`: which cases run (``--quick``, ``--filter``);
* :mod:`~benchmarks.evaluation.dl2_runs`: one ``dl2 run`` of a case;
* :mod:`~benchmarks.evaluation.anchors`: the same cases without dl2 (plain, DETAIL, FR);
* :mod:`~benchmarks.evaluation.overhead`: dl2/plain pairs on the clean workloads;
* :mod:`~benchmarks.evaluation.scoring`: a report against its case's header, and totals;
* :mod:`~benchmarks.evaluation.tables`: the tables and the docs section;
* :mod:`~benchmarks.evaluation.results`: the result records and ``results.jsonl``.
"""
