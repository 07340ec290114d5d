"""Runs out of the log as Parquet datasets, verified by a hashed manifest, and back in.

* :mod:`dressage.exports.tables`: the Arrow schemas of every exported file (documented in
  ``docs/export.md``) and the conversion of log records to Arrow record batches.
* :mod:`dressage.exports.export`: ``dressage-worker export RUN --format parquet`` (streamed in row
  groups, with a manifest written last).
* :mod:`dressage.exports.verify`: ``verify-export`` (re-hash every file against the manifest).
* :mod:`dressage.exports.where`: ``--where``, a read-only SQL predicate over ``trajectories``.
* :mod:`dressage.exports.importer`: ``dressage-worker import DIR [--as RUN]``.
"""
