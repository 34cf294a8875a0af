"""Scad: a serverless runtime for disaggregated applications.

The action API lives in the `disagg` module (the Cython binding over libd); this package holds
what runs around an action: the launcher (`scad.launcher`) and the client of the runtime's
control endpoint behind `action.runtime` (`scad.runtime_client`).
"""
__version__ = "0.1.0"
