"""Harbor tasks as a rollout source (see docs/harbor.md).

- :mod:`dressage.harbor.tasks`: task directories as a dataset (Harbor's own loader when importable);
- :mod:`dressage.harbor.dockerfile` / :mod:`dressage.harbor.rootfs`: whitelisted Dockerfiles as cached
  Debian root filesystems, everything else refused;
- :mod:`dressage.harbor.sandbox`: Harbor's fixed paths (``/tests``, ``/logs``, the workdir) in our sandbox;
- :mod:`dressage.harbor.verifier`: the ``harbor`` reward (``test.sh`` and ``reward.txt``/``reward.json``);
- :mod:`dressage.harbor.oracle`: the ``oracle`` agent (``solution/solve.sh``);
- :mod:`dressage.harbor.environment` / :mod:`dressage.harbor.agent`: the other way round, our sandbox
  and agents plugged into ``harbor run`` (Python 3.12 with the ``harbor`` extra);
- :mod:`dressage.harbor.record` / :mod:`dressage.harbor.job`: a Harbor job as a run, each trial a
  session (afterwards from its output files, or live through Harbor's public ``Job`` hooks).

Nothing here imports torch, so the 3.12 environment (which has none) can import it.
"""
