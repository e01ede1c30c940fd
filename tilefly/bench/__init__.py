"""``python -m tilefly bench``: operator-level speed tables, tilefly against PyTorch's kernels.

Layout: ``cli`` (arguments, GPU check), ``runner`` (providers, cases, suites), ``timing``
(L2-flushed CUDA-event medians; its docstring lists the measurement pitfalls), ``results``
(dataclasses, JSON schema, geomean summaries), ``report`` (Markdown, JSON, PNG from a result),
``inductor`` (bounded max-autotune compiles), ``hooks`` (where each suite finds tilefly's side),
``mx_operands`` (MX benchmark operands, quantized by tilefly.mx), ``suites/<name>.py`` (one per suite),
``cases/*.csv`` (the case lists, identical to the project's shared copies).

Adding tilefly to a suite needs no change here: an eager family is timed once it registers with
the router; a GEMM-like family adds ``tilefly/ops/<family>/bench.py`` with
``tilefly_providers(...) -> {config_name: zero-arg callable}`` (signatures in each suite's docstring).
"""
