"""The memory element server and the demo client as real processes, as the README runs them."""
import os
import re
import subprocess

from scadtest import binary


def run_client(impl, config, aid="it-client", size_mib=8, rounds=2):
    env = dict(os.environ, LIBD_ACTION_ID=aid)
    return subprocess.run([binary("libd-demo-client"), impl, config, str(size_mib), str(rounds)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_client_writes_reads_back_and_verifies_over_shm_and_tcp(memd):
    server = memd()
    assert server.ready["tcp"].startswith("127.0.0.1:")
    for impl in ("shm", "tcp"):
        out = run_client(impl, server.config())
        assert out.returncode == 0, out.stderr
        assert re.search(rf"^{impl}\s+8 MiB x 2 verified\s+write\s+[\d.]+ GB/s\s+read\s+[\d.]+ GB/s$",
                         out.stdout.strip()), out.stdout


def test_a_client_without_the_grant_is_refused_with_a_clear_error(memd):
    server = memd()
    out = run_client("tcp", server.config(), aid="someone-else")
    assert out.returncode == 1
    assert "refused the grant" in out.stderr
    secret = re.search(r"secret,([0-9a-f]+)", server.config()).group(1)
    assert secret not in out.stderr + out.stdout, "a secret leaked into the output"


def test_server_stops_cleanly_on_sigterm_and_removes_its_socket(memd):
    server = memd()
    assert server.sock.exists()
    server.proc.terminate()
    assert server.proc.wait(10) == 0
    assert not server.sock.exists()


def test_server_refuses_bad_arguments_with_usage(tmp_path):
    out = subprocess.run([binary("libd-memd"), "--element", "mem1=lots", "--grants", str(tmp_path / "g")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "--element takes NAME=SIZE" in out.stderr


def test_server_refuses_what_does_not_fit_its_capacity(tmp_path):
    out = subprocess.run([binary("libd-memd"), "--element", "mem1=2GiB", "--capacity", "1GiB",
                          "--grants", str(tmp_path / "g")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "does not fit" in out.stderr
