"""One OpenWhisk action container's state: /init once, then /run after /run, one at a time.

Answers follow OpenWhisk's actionloop runtimes (openwhisk-runtime-go's proxy with
openwhisk-runtime-python's launcher), because the invoker reads them so:
  - any /run answer that is not 200 is a developer error and the invoker destroys the container,
    so an exception in main is 200 {"error": message} (traceback on stderr): an application error;
  - a result must be a JSON object or array, else 502 (the runtimes' "did not return a dictionary
    or array");
  - after every run, and after a failed init, stdout and stderr each end with the sentinel line
    the invoker reads logs up to.
Scad's part: main(args, action) gets a scad.action.Action whose transports come in the run's
value as "__scad_transports" ([{"durl", "config"}]); the action is terminated after each run.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import traceback

from scad import ow_code
from scad.main_signature import takes_action

SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX"
# The invoker reads at most whisk.activation.payload.max bytes of a result (1 MiB by default) and
# turns a longer one into an application error; the proxy says the same without sending it.
DEFAULT_MAX_RESULT = 1048576
TRANSPORTS_KEY = "__scad_transports"


def _json(body):
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _env_text(value):
    return value if isinstance(value, str) else json.dumps(value)


class ActionContainer:
    def __init__(self, folder=None, max_result=DEFAULT_MAX_RESULT, out=None, err=None):
        self.folder = folder          # where the code goes (the image: /action); None: a temp dir
        self.max_result = max_result  # 0: no limit here (the invoker's still applies)
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.main = None
        self.wants_action = False
        self.run_env = set()          # the __OW_* names the last run set
        # One activation at a time, and no run while init imports the code: the runtimes without
        # concurrency do the same, and user code (globals, os.environ) counts on it.
        self.lock = threading.Lock()

    # ---- /init ---------------------------------------------------------------------------
    def init(self, body):
        """body: /init's parsed JSON. Returns (HTTP status, JSON bytes)."""
        with self.lock:
            if self.main is not None:
                return 403, _json({"error": "Cannot initialize the action more than once."})
            value = body.get("value") if isinstance(body, dict) else None
            value = value if isinstance(value, dict) else {}
            code = value.get("code")
            if code is None or code == "":
                return 403, _json({"error": "Missing main/no code to execute."})
            if not isinstance(code, str):
                return 400, _json({"error": "Error unmarshaling request: \"code\" must be a string"})
            env = value.get("env") or {}
            if not isinstance(env, dict):
                return 400, _json({"error": "Error unmarshaling request: \"env\" must be an object"})
            # The action's parameters bound at create time, set before the import (module-level
            # code reads them), as the runtimes set them.
            for key, v in env.items():
                os.environ[str(key)] = _env_text(v)
            folder = self._code_folder()
            try:
                fn = ow_code.load(value, folder)
            except ow_code.BadRequest as e:
                shutil.rmtree(folder, ignore_errors=True)
                return 400, _json({"error": str(e)})
            except ow_code.InitError as e:
                shutil.rmtree(folder, ignore_errors=True)
                print(e, file=self.err)
                self._sentinels()
                message = ("The action failed to generate or locate a binary. See logs for details." if e.kind == "build"
                           else "Cannot start action. Check logs for details.")
                return 502, _json({"error": message})
            self.main, self.wants_action = fn, takes_action(fn)
            return 200, b'{"ok":true}'

    def _code_folder(self):
        if self.folder is None:
            return tempfile.mkdtemp(prefix="scad-action-")
        path = os.path.join(self.folder, "code")
        shutil.rmtree(path, ignore_errors=True)  # what a failed init left
        os.makedirs(path)
        return path

    # ---- /run ----------------------------------------------------------------------------
    def run(self, body):
        """body: /run's parsed JSON ({"value": args, "activation_id", "deadline", ...}).
        Returns (HTTP status, JSON bytes)."""
        if not isinstance(body, dict):
            return 400, _json({"error": "Error unmarshaling request: the body must be a JSON object"})
        value = body.get("value", {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            return 400, _json({"error": "Error unmarshaling request: \"value\" must be a JSON object"})
        with self.lock:
            if self.main is None:
                return 500, _json({"error": "no action defined yet"})
            try:
                return self._run(body, dict(value))
            finally:
                self._sentinels()

    def _run(self, body, args):
        self._set_run_env(body)
        transports = args.pop(TRANSPORTS_KEY, None)
        action = None
        try:
            if self.wants_action:
                action = self._action(body, transports)
                result = self.main(args, action)
            else:
                result = self.main(args)
        except BaseException as e:  # noqa: BLE001 - sys.exit() in main ends the activation, not the container
            traceback.print_exc(file=self.err)
            return 200, _json({"error": str(e) or type(e).__name__})
        finally:
            if action is not None:
                try:
                    action.terminate()
                except Exception:  # noqa: BLE001 - the result stands; the failure goes to the logs
                    traceback.print_exc(file=self.err)
        return self._result(result)

    def _set_run_env(self, body):
        """Every field of the run but "value" as __OW_<FIELD> (api_host, api_key, namespace,
        action_name, action_version, activation_id, transaction_id, deadline), as the runtimes
        set them. A name the previous run set and this one lacks is removed, so that one
        activation's api_key is never seen by the next."""
        names = set()
        for key, v in body.items():
            if key != "value" and isinstance(key, str) and key:
                name = f"__OW_{key.upper()}"
                os.environ[name] = _env_text(v)
                names.add(name)
        for stale in self.run_env - names:
            os.environ.pop(stale, None)
        self.run_env = names

    def _action(self, body, transports):
        from scad.action import Action  # only mains that take the action pay for the binding
        aid = body.get("activation_id")
        action = Action(aid if isinstance(aid, str) and aid else "ow-action")
        try:
            for t in _transports(transports):
                action.add_transport(t["durl"])
                if t.get("config"):
                    action.config_transport(t["durl"].split(";", 1)[0], t["config"])
        except BaseException:
            action.terminate()
            raise
        return action

    def _result(self, result):
        if not isinstance(result, (dict, list)):
            print(f"The action returned {type(result).__name__}, not a dictionary or array.", file=self.err)
            return 502, _json({"error": "The action did not return a dictionary or array."})
        try:
            data = json.dumps(result, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as e:
            print(f"The action's result is not JSON: {type(e).__name__}: {e}", file=self.err)
            return 502, _json({"error": "The action did not return a dictionary or array."})
        if self.max_result and len(data) > self.max_result:
            return 200, _json({"error": "The action produced a response that exceeded the allowed length: "
                                        f"{len(data)} > {self.max_result} bytes."})
        return 200, data

    def _sentinels(self):
        for stream in (self.out, self.err):
            try:
                stream.flush()
                stream.write(SENTINEL + "\n")
                stream.flush()
            except (OSError, ValueError):  # a closed log stream must not fail the activation
                pass


def _transports(transports):
    """The run's "__scad_transports", checked: a list of {"durl": str, "config": ...}."""
    if transports is None:
        return []
    if not isinstance(transports, list) or not all(
            isinstance(t, dict) and isinstance(t.get("durl"), str) and t["durl"] for t in transports):
        raise ValueError(f"{TRANSPORTS_KEY} must be a list of {{\"durl\": \"NAME;IMPL\", \"config\": ...}}")
    return transports
