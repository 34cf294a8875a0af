"""Whether an action's main asks for the action object: one rule for the agent's launcher and the
OpenWhisk proxy, kept free of the binding so that either can ask before loading it."""
import inspect


def takes_action(fn):
    """Whether main asks for the action object: its second positional parameter is named `action`
    or has no default value (main(args, action)); or it takes *args. A second parameter with a
    default (main(args, verbose=False)) is the user's own option, not a place for the action, and a
    plain OpenWhisk main(args) gets the arguments only."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a signature: Scad's form
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:
        second = positional[1]
        return second.name == "action" or second.default is second.empty
    return any(p.kind == p.VAR_POSITIONAL for p in params)
