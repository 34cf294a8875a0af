import json
import urllib.error
import urllib.request


def main(args, action):
    first = args["first"][0]
    req = urllib.request.Request(f"{first['url']}/v1/actions/{first['aid']}/elements", method="POST",
                                 data=json.dumps({"template": "scratch", "name": "late"}).encode())
    req.add_header("Authorization", "Bearer " + first["token"])
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return {"status": r.status}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": json.loads(e.read())["error"]}
