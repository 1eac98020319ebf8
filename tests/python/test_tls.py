"""`tensile.Client` and the hook's session (`tensile._core.Session`, the
Rust session) talking to the real `tensile-scheduler` binary over mutual
TLS on 127.0.0.1, with a throwaway CA made here by the `openssl` command
(the venv has no `cryptography`; the test is skipped where `openssl` is
missing); a client without a certificate, one trusting another CA, and a
plaintext one are refused."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import grpc
import pytest

import tensile
from tensile import client as tc

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = os.environ.get("TENSILE_SCHEDULER", str(ROOT / "target" / "debug" / "tensile-scheduler"))
OPENSSL = shutil.which("openssl")

pytestmark = pytest.mark.skipif(OPENSSL is None, reason="no openssl command to make the test CA with")

TLS_ENV = ("TENSILE_TLS_CA", "TENSILE_TLS_CERT", "TENSILE_TLS_KEY", "TENSILE_TLS_CLIENT_CA", "TENSILE_SERVER")


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> Path:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}-ca-key.pem", "-out", f"{name}-ca.pem", "-days", "2", "-subj", f"/CN={name} test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        cwd=folder,
    )
    return folder / f"{name}-ca.pem"


def sign(folder: Path, ca: str, stem: str, extensions: str) -> tuple[Path, Path]:
    (folder / f"{stem}.ext").write_text(extensions)
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{stem}-key.pem", "-out", f"{stem}.csr", "-subj", f"/CN={stem}",
        cwd=folder,
    )
    openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca-key.pem",
        "-CAcreateserial", "-out", f"{stem}.pem", "-days", "2", "-extfile", f"{stem}.ext",
        cwd=folder,
    )
    return folder / f"{stem}.pem", folder / f"{stem}-key.pem"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca = make_ca(folder, "tensile")
    other = make_ca(folder, "other")
    server = sign(folder, "tensile", "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = sign(folder, "tensile", "client", "extendedKeyUsage=clientAuth\n")
    return {"ca": ca, "other": other, "server": server, "client": client}


@pytest.fixture(scope="module")
def server(pki, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sched")
    env = {k: v for k, v in os.environ.items() if k not in TLS_ENV}
    log_path = folder / "scheduler.log"
    log = open(log_path, "w")
    cert, key = pki["server"]
    proc = subprocess.Popen(
        [SCHEDULER, "--listen", "127.0.0.1:0", "--state", "none", "--device", "a6000", "--latency-models", "roofline",
         "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki["ca"])],
        stdout=log, stderr=subprocess.STDOUT, env={**env, "RUST_LOG": "info"},
    )
    deadline = time.monotonic() + 30
    address = None
    while address is None:
        found = re.search(r"listening on (127\.0\.0\.1:\d+) \(mutual TLS\)", log_path.read_text())
        if found:
            address = found.group(1)
        elif proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"tensile-scheduler did not start: {log_path.read_text()}")
        else:
            time.sleep(0.05)
    yield address
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def clean_env(monkeypatch):
    for k in TLS_ENV:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_client_over_mutual_tls_by_arguments_and_by_environment(server, pki, clean_env):
    cert, key = pki["client"]
    with tensile.Client(server, tls_ca=pki["ca"], tls_cert=cert, tls_key=key) as c:
        assert c.tls
        assert c.status().device == "a6000"
    clean_env.setenv("TENSILE_TLS_CA", str(pki["ca"]))
    clean_env.setenv("TENSILE_TLS_CERT", str(cert))
    clean_env.setenv("TENSILE_TLS_KEY", str(key))
    for address in (server, f"https://{server}", f"localhost:{server.rsplit(':', 1)[1]}"):
        with tensile.Client(address) as c:
            assert c.status().device == "a6000", address


def test_refused_without_a_certificate_with_another_ca_or_in_plaintext(server, pki, clean_env):
    cert, key = pki["client"]
    attempts = {
        "no client certificate": dict(tls_ca=pki["ca"]),
        "another CA": dict(tls_ca=pki["other"], tls_cert=cert, tls_key=key),
        "plaintext": dict(),
    }
    for what, kwargs in attempts.items():
        with tensile.Client(server, timeout_s=5, **kwargs) as c:
            with pytest.raises(tc.SchedulerError) as e:
                c.status()
            assert e.value.code == grpc.StatusCode.UNAVAILABLE, what


def test_bad_tls_settings_are_named(pki, clean_env):
    with pytest.raises(ValueError, match="https needs tls_ca"):
        tc.tls_credentials("https://127.0.0.1:1")
    with pytest.raises(ValueError, match="need tls_ca"):
        tc.tls_credentials("127.0.0.1:1", cert=pki["client"][0], key=pki["client"][1])
    with pytest.raises(ValueError, match="missing.pem"):
        tc.tls_credentials("127.0.0.1:1", ca=Path(pki["ca"]).parent / "missing.pem")
    with pytest.raises(ValueError, match="go together"):
        tc.tls_credentials("127.0.0.1:1", ca=pki["ca"], cert=pki["client"][0])
    # A Unix socket never uses TLS; http:// stays plaintext.
    assert tc.tls_credentials("unix:/tmp/s.sock", ca=pki["ca"]) is None
    assert tc.tls_credentials("http://127.0.0.1:1", ca=pki["ca"]) is None
    assert tc.tls_credentials("127.0.0.1:1", ca=pki["ca"]) is not None


def test_the_hook_session_takes_tls_from_the_environment(server, pki, clean_env):
    from tensile import _core

    torch = pytest.importorskip("torch")
    from tensile.trace import InputSpec, trace_training_step

    traced = trace_training_step(
        lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)),
        torch.optim.SGD,
        [InputSpec("input", (8, 16))],
        name="tls-mlp",
    )
    cert, key = pki["client"]
    clean_env.setenv("TENSILE_TLS_CA", str(pki["ca"]))
    clean_env.setenv("TENSILE_TLS_CERT", str(cert))
    clean_env.setenv("TENSILE_TLS_KEY", str(key))
    session = _core.Session(traced, server, "tls-hook")
    try:
        deadline = time.monotonic() + 30
        while session.take_plan() is None:
            assert time.monotonic() < deadline, f"no plan over TLS: {session.status()}"
            time.sleep(0.05)
    finally:
        session.finish(2.0)
    # A certificate without its key is refused when the session starts.
    clean_env.delenv("TENSILE_TLS_KEY")
    with pytest.raises(ValueError, match="TENSILE_TLS_KEY"):
        _core.Session(traced, server, "tls-hook")


WORKER = os.environ.get("TENSILE_WORKER", str(ROOT / "target" / "debug" / "tensile-worker"))


def test_the_worker_binary_trains_on_plans_over_mutual_tls(server, pki):
    if not Path(WORKER).exists():
        pytest.fail(f"{WORKER} is missing: cargo build -p tensile-worker (or set TENSILE_WORKER)")
    cert, key = pki["client"]
    env = {k: v for k, v in os.environ.items() if k not in TLS_ENV}
    cmd = [WORKER, "--scheduler", server, "--model", "resnet50", "--batch", "2", "--resolution", "32",
           "--iterations", "2", "--threads", "1", "--link-gbps", "2", "--tls-ca", str(pki["ca"])]
    # The CA by flag, the client certificate from the environment.
    done = subprocess.run([*cmd, "--plan-timeout-s", "30"], capture_output=True, text=True, timeout=300,
                          env={**env, "TENSILE_TLS_CERT": str(cert), "TENSILE_TLS_KEY": str(key)})
    assert done.returncode == 0, done.stderr
    assert re.search(r"plan version \d+ of job \d+", done.stderr), done.stderr
    # Without its certificate the worker is refused, and says why.
    done = subprocess.run([*cmd, "--plan-timeout-s", "3"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert "requires a client certificate" in done.stderr, done.stderr
