"""End-to-end benchmark: LLM decoding throughput with and without tilefly (issue 9).

``models`` (configs written in code, random weights), ``engine`` (static-cache greedy
generation, compiled decode steps), ``ab`` (the A/B driver), ``picks`` (which GEMM kernels
Inductor chose), ``split`` (A and B in separate processes: what each keeps, how the merge pairs
them), ``report`` (merge runs; Markdown, JSON, PNG). Command line:
``python -m tilefly.bench.e2e --help``. Needs ``transformers`` (5.x); importing this package
imports neither transformers nor Inductor.
"""
