"""Offline tuning databases: measured on a GPU by a tuner, shipped as data, read at dispatch time.

A database is one small JSON file per op family and GPU model, named
``<family>_<gpu key>.json`` (``attention_sm90_h200.json``) under ``tuning/data/``.
It is produced by ``python -m tilefly tune <family>``, never written by hand, and
reviewed as a diff: the header fields come first and every entry sits on its own
line, with keys sorted.

``db`` holds what every family shares: file naming by GPU, loading with
validation, ``<=`` binning of sequence-like sizes, the diffable writer and
merging of partial runs. Each family defines its own entry schema and lookup
(``tilefly/ops/attention/database.py``). Importing this package needs no GPU.
"""
