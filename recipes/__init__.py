"""Recipes: real agentic tasks end to end, one folder each (``recipes/README.md`` is the layout).

A recipe's Python code is this package's modules (``recipes.NAME.agent``, ``.loader``, ``.reward``),
installed with Dressage (``pip install -e .``), so a config names them by dotted path from any
working directory. Nothing in :mod:`dressage` imports a recipe.
"""
