import os

MODE_AT_IMPORT = os.environ.get("MODE")  # what a library that reads it once, at import, would see
PROCESS = os.urandom(8).hex()  # names the process (a warm one keeps the module; pids are the sandbox's)


def main(args, action):
    mine = {"at_import": MODE_AT_IMPORT, "now": os.environ.get("MODE"), "empty": os.environ.get("EMPTY"),
            "process": PROCESS}
    return {"first": args["first"][0], "second": mine} if "first" in args else mine
