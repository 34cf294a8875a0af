"""Scad: a serverless runtime for disaggregated applications.

The action API lives in the `disagg` module (the Cython binding over libd); this package holds
what runs around an action: the action object main() receives (`scad.action.Action`: libd's action
plus `action.runtime`, the client of the runtime endpoint in `scad.runtime_client`) and the launcher
(`scad.launcher`). The binding never imports this package.
"""
__version__ = "0.1.0"

from ._compiled import prefer_compiled

prefer_compiled(__name__, __path__)  # the per-operation modules, compiled by the build when it could
