"""The long-running processes behind ``dressage-worker`` (rollout, train, proxy, engine).

This is the program's top: importing it registers the built-in task kinds (Harbor's task
directories, :mod:`dressage.harbor.kind`) with rollout, which never imports them itself.
"""

from dressage.harbor.kind import register as _register_harbor

_register_harbor()
