"""The dashboard's attack surface over real HTTP: artifact paths a launcher names, trial numbers, --host.

A launcher controls the artifact paths recorded for its trial. Each row records one hostile path
and requests it; only files inside the study's own run folder may come back.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from autotune.backends.runs import study_dir
from autotune.config import LayoutConfig
from autotune.dashboard.server import serve_in_background
from autotune.storage import Repository

BIG = bytes(range(256)) * (3 * 4096) + b"tail!"  # 3 MiB and 5 bytes: more than one streamed chunk
SECRET = "/etc/passwd"  # readable here; /etc/shadow is tried too (root can read it)


@pytest.fixture
def served(tmp_path):
    repo = Repository.open(f"sqlite:///{tmp_path / 'dash.db'}")
    options = {"workdir": str(tmp_path / "runs")}
    study = repo.create_study(name="s", model="qwen3_30b",
                              workload={"gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024,
                                        "seq_length": 4096, "precision": "bf16"},
                              space={"domains": {}}, budget=1, sampler="auto", backend="command",
                              backend_options=options, options={}, optuna_study_name="autotune:s", status="finished")
    run = study_dir(options, "s") / "trial1-attempt1"
    run.mkdir(parents=True)
    (run / "report.nsys-rep").write_bytes(b"NSYS")
    # a hostile launcher's page and script (they would run in the dashboard's origin if served as such)
    (run / "report.html").write_text("<script src='/artifact/s/1/js'></script><script>document.title='RAN'</script>")
    (run / "x.js").write_text("document.body.innerHTML = '<p>JS RAN</p>'")
    (run / "plot.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>")
    (run / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (run / "train.log").write_text("<b>iteration 1</b>")
    (run / "big.sqlite").write_bytes(BIG)
    (run / "link-out").symlink_to(SECRET)
    (run / "dir-out").symlink_to("/etc")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the study's")
    artifacts = {"ok": str(run / "report.nsys-rep"), "shadow": "/etc/shadow", "passwd": SECRET,
                 "dotdot": str(run / ".." / ".." / ".." / "outside.txt"), "relative": "../../etc/passwd",
                 "symlink-file": str(run / "link-out"), "symlink-dir": str(run / "dir-out" / "passwd"),
                 "sibling": str(outside), "the-folder": str(run), "nul": str(run / "report.nsys-rep") + "\0x",
                 "page": str(run / "report.html"), "js": str(run / "x.js"), "svg": str(run / "plot.svg"),
                 "png": str(run / "loss.png"), "log": str(run / "train.log"), "big": str(run / "big.sqlite")}
    layout = LayoutConfig.from_mapping({"ep": 16})
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 1)
    repo.finish_trial(study.id, trial.number, "failed", reason="failed", artifacts=artifacts)
    server = serve_in_background(repo, artifact_roots=(tmp_path,))
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    repo.close()


def _read(handle) -> bytes | None:
    """What the dashboard would serve from open_confined's answer (None: nothing)."""
    if handle is None:
        return None
    with handle:
        return handle.read()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("key", ["shadow", "passwd", "dotdot", "relative", "symlink-file", "symlink-dir", "sibling",
                                 "the-folder", "nul"])
def test_artifacts_outside_the_study_run_folder_are_refused(served, key):
    status, body = _get(f"{served}/artifact/s/1/{quote(key, safe='')}")
    assert status == 404
    assert b"root:" not in body and b"not the study's" not in body


def test_an_artifact_inside_the_run_folder_is_served(served):
    assert _get(f"{served}/artifact/s/1/ok") == (200, b"NSYS")


def test_a_large_artifact_is_streamed_whole_and_capped(served, monkeypatch):
    """Sent in chunks from the open file (never read whole into memory): every byte arrives; past
    MAX_ARTIFACT_BYTES only the cap is sent, and Content-Length says so."""
    from autotune.dashboard import server

    assert _get(f"{served}/artifact/s/1/big") == (200, BIG)
    monkeypatch.setattr(server, "MAX_ARTIFACT_BYTES", (1 << 20) + 3)
    with urllib.request.urlopen(f"{served}/artifact/s/1/big", timeout=10) as response:
        assert response.headers["Content-Length"] == str((1 << 20) + 3)
        assert response.read() == BIG[:(1 << 20) + 3]
    head = urllib.request.Request(f"{served}/artifact/s/1/big", method="HEAD")
    with urllib.request.urlopen(head, timeout=10) as response:
        assert response.headers["Content-Length"] == str((1 << 20) + 3) and response.read() == b""


def test_a_read_failing_mid_stream_cuts_the_answer_short_and_closes_the_file(served, monkeypatch):
    """Once an artifact's headers are out, a failing read (EIO on a dying disk) can only end the connection:
    no 500 page inside the 200's body, and the file is closed."""
    import http.client

    from autotune.dashboard import _artifacts, server

    opened = []
    real_open = _artifacts.open_confined

    class Failing:
        def __init__(self, handle):
            self.handle, self.reads = handle, 0
            opened.append(self)

        def fileno(self):
            return self.handle.fileno()

        def read(self, size):
            self.reads += 1
            if self.reads > 1:
                raise OSError(5, "Input/output error")
            return self.handle.read(size)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(_artifacts, "open_confined", lambda *a: Failing(real_open(*a)))
    connection = http.client.HTTPConnection(served.removeprefix("http://"), timeout=10)
    connection.request("GET", "/artifact/s/1/big")
    response = connection.getresponse()
    assert response.status == 200 and response.headers["Content-Length"] == str(len(BIG))
    with pytest.raises(http.client.IncompleteRead) as cut:
        response.read()
    assert cut.value.partial == BIG[:server.STREAM_CHUNK_BYTES] and b"HTTP/1" not in cut.value.partial
    connection.close()
    assert len(opened) == 1 and opened[0].handle.closed


FILES = {"page": "report.html", "js": "x.js", "svg": "plot.svg", "ok": "report.nsys-rep"}


@pytest.mark.parametrize("key,content_type,download", [
    ("page", "application/octet-stream", True), ("js", "application/octet-stream", True),
    ("svg", "application/octet-stream", True), ("ok", "application/octet-stream", True),
    ("png", "image/png", False), ("log", "text/plain; charset=utf-8", False)])
def test_a_launcher_written_page_or_script_never_runs_in_the_dashboard(served, key, content_type, download):
    """HTML, SVG and scripts a launcher wrote come back as downloads, never as a page or a script of the
    dashboard's origin; every artifact carries a sandboxing CSP; images and text are shown inline."""
    with urllib.request.urlopen(f"{served}/artifact/s/1/{key}", timeout=10) as response:
        headers = response.headers
    assert headers["Content-Type"] == content_type
    assert headers["X-Content-Type-Options"] == "nosniff"
    policy = headers["Content-Security-Policy"]
    assert "sandbox" in policy and "script-src" not in policy and "default-src 'none'" in policy
    disposition = headers.get("Content-Disposition") or ""
    assert disposition.startswith("attachment") == download
    if download:  # the file's own name, so a trace downloads as .nsys-rep
        assert disposition == f'attachment; filename="{FILES[key]}"'


@pytest.mark.parametrize("path", ["/study/s/trial/99999999999999999999999", "/artifact/s/99999999999999999999999/ok",
                                  "/study/s/trial/2147483648", "/study/s/trial/%D9%A3", "/study/s/trial/-1"])
def test_impossible_trial_numbers_get_a_404_not_a_dead_connection(served, path):
    status, _ = _get(served + path)
    assert status == 404


def _dashboard_stderr(tmp_path, host: str) -> str:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    Repository.open(url).close()
    process = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--host", host, "--port", "0",
                                "--storage", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "autotune dashboard on http://" in process.stdout.readline()
        time.sleep(0.3)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    return stderr


def test_binding_every_interface_warns_that_there_is_no_authentication(tmp_path):
    stderr = _dashboard_stderr(tmp_path, "0.0.0.0")
    assert "no authentication" in stderr and "0.0.0.0" in stderr


def test_the_default_loopback_address_prints_no_warning(tmp_path):
    assert "warning" not in _dashboard_stderr(tmp_path, "127.0.0.1")


def test_an_ipv6_loopback_address_is_served(tmp_path):
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    repo = Repository.open(f"sqlite:///{tmp_path / 'v6.db'}")
    server = serve_in_background(repo, host="::1")
    try:
        assert _get(f"http://[::1]:{server.server_address[1]}/")[0] == 200
    finally:
        server.shutdown()
        repo.close()


def test_the_check_resolves_before_comparing(tmp_path):
    """A path that starts with the run folder's name but leaves it (prefix trick) is refused."""
    from autotune.dashboard._artifacts import confined_path

    options = {"workdir": str(tmp_path / "runs")}
    (tmp_path / "runs" / "s").mkdir(parents=True)
    twin = tmp_path / "runs" / "s-evil"
    twin.mkdir()
    (twin / "f").write_text("x")
    assert confined_path(str(twin / "f"), options, "s", (tmp_path,)) is None
    (tmp_path / "runs" / "s" / "f").write_text("y")
    assert confined_path(str(tmp_path / "runs" / "s" / "f"), options, "s", (tmp_path,)) == (tmp_path / "runs" / "s" / "f").resolve()


def _raw(base: str, request: bytes) -> bytes:
    import socket

    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("host_header", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1",
                                         "localhost.evil.example", "[::ffff:10.0.0.1]", ""])
def test_a_request_naming_another_host_is_refused(served, host_header):
    """DNS rebinding: a page on another site can have the browser send requests to 127.0.0.1 under its
    own name and read every study; a dashboard bound to loopback answers only requests naming loopback."""
    answer = _raw(served, f"GET /api/study/s HTTP/1.0\r\nHost: {host_header}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 421") and b"qwen3_30b" not in answer
    assert answer.endswith(b'{"error": "this dashboard answers to localhost only"}')  # JSON to an API client


@pytest.mark.parametrize("host_header", ["localhost", "localhost:1234", "127.0.0.1:80", "[::1]:8080", "LOCALHOST",
                                         "localhost.:80", "app.localhost", "[::ffff:127.0.0.1]:8080", "[::1%25lo]"])
def test_a_request_naming_loopback_is_answered(served, host_header):
    answer = _raw(served, f"GET /api/study/s HTTP/1.0\r\nHost: {host_header}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200") and b"qwen3_30b" in answer


@pytest.mark.parametrize("request_line,status", [
    (b"POST /api/study/s HTTP/1.0", 405), (b"PUT / HTTP/1.0", 405), (b"DELETE /study/s HTTP/1.0", 405),
    (b"OPTIONS * HTTP/1.0", 405), (b"BREW / HTTP/1.0", 501), (b"GET /" + b"a" * 70000 + b" HTTP/1.0", 414)])
def test_every_answer_carries_the_security_headers(served, request_line, status):
    """Found by review: methods other than GET and HEAD got http.server's bare 501 page, and its own errors
    (an unknown method, a 414) carried no Content-Security-Policy, nosniff or framing refusal. The dashboard
    only reads: 405 naming GET and HEAD (501 for a method HTTP does not know), every answer with the headers."""
    answer = _raw(served, request_line + b"\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
    head = answer.partition(b"\r\n\r\n")[0]
    assert b"qwen3_30b" not in answer
    assert int(head.split(b" ")[1]) == status
    if status in (405, 501):
        assert b"Allow: GET, HEAD" in head
    if status == 405:
        # under /api the refusal is JSON, elsewhere a page
        assert (b"application/json" in head) == (b" /api/" in request_line)
    assert b"X-Content-Type-Options: nosniff" in head and b"frame-ancestors 'none'" in head
    assert b"X-Frame-Options: DENY" in head


def test_head_gives_the_headers_of_get_without_a_body(served):
    answer = _raw(served, b"HEAD /api/study/s HTTP/1.0\r\nHost: localhost\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Content-Length: " in head and body == b""
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    assert length == len(urllib.request.urlopen(served + "/api/study/s").read())


def test_a_client_that_resets_mid_answer_leaves_no_traceback(tmp_path):
    """A client that goes away (a reset, `curl | head`) is nobody to answer: no traceback on the
    dashboard's stderr, no second attempt at an error page, and the server answers the next request."""
    import socket
    import struct

    url = f"sqlite:///{tmp_path / 'd.db'}"
    Repository.open(url).close()
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--storage", url, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            s.sendall(b"GET /static/plotly.min.js HTTP/1.0\r\nHost: localhost\r\n\r\n")  # a large answer
            s.close()
        time.sleep(1)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/").status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "Error" not in err, err


def test_two_studies_never_share_a_run_folder():
    """Found by review: `a/b` and `a_b` mapped to one run folder, so each study's dashboard could serve
    artifacts the other's launcher wrote there. A changed name now carries a digest of itself."""
    from autotune.backends.runs import safe_name

    names = ["a/b", "a_b", "a b", "a\\b", "a:b", "..", ".", "a..b", "é", "e", "_", "-" * 200, "x" * 200, "demo",
             safe_name("a/b"),  # a name spelt like another's folder (found by the second review)
             "Demo", "DEMO", safe_name("Demo").lower()]  # one folder on a case-insensitive file system
    folders = [safe_name(n) for n in names]
    assert len({f.lower() for f in folders}) == len(names)
    for folder in folders:
        assert "/" not in folder and "\\" not in folder and folder.strip(".") and len(folder) <= 200
    assert safe_name("demo") == "demo" and safe_name("a_b") == "a_b"  # unchanged names keep their folder


def test_a_folder_swapped_for_a_symlink_after_the_check_leads_nowhere(tmp_path, monkeypatch):
    """Found by review: the artifact was opened by its full path with O_NOFOLLOW, which guards the last
    component only; a launcher still running could swap a folder of the path for a symlink between the
    check and the open. Replayed here by handing the open a path checked before the swap."""
    from autotune.dashboard import _artifacts

    options = {"workdir": str(tmp_path / "runs")}
    folder = study_dir(options, "s") / "trial1-attempt1" / "logs"
    folder.mkdir(parents=True)
    (folder / "out.txt").write_text("inside")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "out.txt").write_text("SECRET")
    checked = _artifacts._confined(str(folder / "out.txt"), options, "s", (tmp_path,))
    assert _read(_artifacts.open_confined(str(folder / "out.txt"), options, "s", (tmp_path,))) == b"inside"
    (folder / "out.txt").unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    monkeypatch.setattr(_artifacts, "_confined", lambda *_args: checked)  # the check ran before the swap
    assert _read(_artifacts.open_confined(str(folder / "out.txt"), options, "s", (tmp_path,))) is None


def test_the_folder_an_older_version_gave_a_study_is_not_served_for_it(tmp_path):
    """A study whose name had to be changed (`qwen3 tpe/16`) got the folder `qwen3_tpe_16` before; it has a
    digest now. Found by review: that older folder is the current folder of the study named `qwen3_tpe_16`
    (and on a case-insensitive file system `Demo`'s older folder is `demo`'s), so the dashboard serves only
    a study's own folder; an unharvested outcome there is still found, since each names its study."""
    from autotune.backends.runs import study_dir, study_dirs
    from autotune.dashboard._artifacts import open_confined

    options = {"workdir": str(tmp_path / "runs")}
    old = tmp_path / "runs" / "qwen3_tpe_16" / "trial1-attempt1"
    old.mkdir(parents=True)
    (old / "log.txt").write_text("a run of the study named qwen3_tpe_16")
    assert study_dir(options, "qwen3 tpe/16") != old.parent and study_dirs(options, "qwen3 tpe/16")[1] == old.parent
    assert _read(open_confined(str(old / "log.txt"), options, "qwen3 tpe/16", (tmp_path,))) is None
    assert _read(open_confined(str(old / "log.txt"), options, "qwen3_tpe_16", (tmp_path,))) == b"a run of the study named qwen3_tpe_16"


def test_a_study_folder_that_is_a_symlink_serves_nothing(tmp_path):
    """Review: with `<workdir>/<study>` swapped for a symlink to `/` (a launcher writes beside it), every
    file on the machine resolved "inside" the run folder and /etc/passwd was served. A workdir that is
    itself a link (the user's choice) still works."""
    from autotune.dashboard._artifacts import confined_path, open_confined

    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "s").symlink_to("/")
    options = {"workdir": str(tmp_path / "wd")}
    for path in ("/etc/passwd", str(tmp_path / "wd" / "s" / "etc" / "passwd")):
        assert confined_path(path, options, "s", (tmp_path,)) is None and open_confined(path, options, "s", (tmp_path,)) is None
    real = tmp_path / "real"
    (real / "s" / "trial1-attempt1").mkdir(parents=True)
    (real / "s" / "trial1-attempt1" / "log.txt").write_text("ok")
    (tmp_path / "linked").symlink_to(real)
    options = {"workdir": str(tmp_path / "linked")}
    assert _read(open_confined(str(tmp_path / "linked" / "s" / "trial1-attempt1" / "log.txt"), options, "s", (tmp_path,))) == b"ok"


def _study_with_artifact(repo, name: str, workdir: str, artifact: str):
    study = repo.create_study(name=name, model="qwen3_30b",
                              workload={"gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024,
                                        "seq_length": 4096, "precision": "bf16"},
                              space={"domains": {}}, budget=1, sampler="auto", backend="command",
                              backend_options={"workdir": workdir}, options={},
                              optuna_study_name=f"autotune:{name}", status="finished")
    layout = LayoutConfig.from_mapping({"ep": 16})
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 1)
    repo.finish_trial(study.id, trial.number, "completed", reason=None, artifacts={"key": artifact})
    return study


def test_a_study_named_like_a_dot_folder_never_owns_it(tmp_path):
    """Review: a study named `.ssh` started with `--workdir ~` made `~/.ssh` its run folder, and a launcher's
    artifact `~/.ssh/id_rsa` was served at /artifact/.ssh/1/key. A leading dot now gets a digest, and the
    home folder is no artifact root unless the dashboard's operator names it."""
    from autotune.backends.runs import safe_name
    from autotune.dashboard.server import DashboardApp

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    assert safe_name(".ssh") != ".ssh" and safe_name(".ssh").startswith(".ssh-")
    repo = Repository.open(f"sqlite:///{tmp_path / 'd.db'}")
    _study_with_artifact(repo, ".ssh", str(home), str(home / ".ssh" / "id_rsa"))
    for roots in (None, (home,), (tmp_path,)):  # the default root, and an operator who named the home folder
        app = DashboardApp(repo, artifact_roots=roots)
        assert app.artifact(".ssh", 1, "key") is None
        assert "/artifact/" not in app.trial_page(".ssh", 1).decode()
    repo.close()


def test_only_run_folders_inside_an_artifact_root_are_served(tmp_path):
    """Whoever starts a study chooses its --workdir; the dashboard's operator chooses what is served. A run
    folder outside the roots is listed without a link and a note says how to serve it."""
    from autotune.backends.runs import study_dir
    from autotune.dashboard.server import DashboardApp

    options = {"workdir": str(tmp_path / "scratch")}
    run = study_dir(options, "s") / "trial1-attempt1"
    run.mkdir(parents=True)
    (run / "log.txt").write_text("measured")
    repo = Repository.open(f"sqlite:///{tmp_path / 'd.db'}")
    _study_with_artifact(repo, "s", options["workdir"], str(run / "log.txt"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = DashboardApp(repo, artifact_roots=(elsewhere,))
    assert refused.artifact("s", 1, "key") is None
    page = refused.trial_page("s", 1).decode()
    assert "/artifact/s/1/key" not in page and str(run / "log.txt") in page
    assert f"--artifact-root {tmp_path / 'scratch'}" in page  # the flag that would serve it, spelt out
    served = DashboardApp(repo, artifact_roots=(elsewhere, tmp_path / "scratch"))
    found = served.artifact("s", 1, "key")
    with found[0] as handle:
        assert handle.read() == b"measured"
    assert "/artifact/s/1/key" in served.trial_page("s", 1).decode()
    repo.close()


def test_a_relative_workdir_or_artifact_path_is_served_from_nowhere(tmp_path, monkeypatch):
    """A relative --workdir (older versions stored it as typed) or artifact path meant the folder the
    controller or launcher ran in; read against the dashboard's own working folder it named other files."""
    from autotune.backends.runs import study_dir
    from autotune.dashboard._artifacts import confined_path

    monkeypatch.chdir(tmp_path)
    run = study_dir({"workdir": "runs"}, "s") / "trial1-attempt1"
    run.mkdir(parents=True)
    (run / "log.txt").write_text("x")
    assert confined_path(str(tmp_path / run / "log.txt"), {"workdir": "runs"}, "s", (tmp_path,)) is None
    absolute = {"workdir": str(tmp_path / "runs")}
    assert confined_path(str(run / "log.txt"), absolute, "s", (tmp_path,)) is None  # relative artifact path
    assert confined_path(str(tmp_path / run / "log.txt"), absolute, "s", (tmp_path,)) is not None


def test_start_stores_the_workdir_absolute(tmp_path, monkeypatch):
    """From the command line and from the Python API (review: only the CLI made it absolute)."""
    import argparse

    from autotune.backends import backend_class
    from autotune.controller.session import create_study
    from autotune.space import load_space, make_workload

    monkeypatch.chdir(tmp_path)
    for backend in ("simulate", "command", "megatron", "replay"):
        options = backend_class(backend).options_from_cli(argparse.Namespace(workdir="runs/x"))
        assert options["workdir"] == str(tmp_path / "runs" / "x"), backend
    repo = Repository.open(f"sqlite:///{tmp_path / 'api.db'}")
    space = load_space("qwen3_30b")
    study = create_study(repo, name="api", space=space, workload=make_workload(space, gpus=16), budget=1,
                         sampler="random", backend="simulate", seed=0, backend_options={"workdir": "runs/y"})
    assert repo.get_study("api").backend_options["workdir"] == str(tmp_path / "runs" / "y") == \
        study.backend_options["workdir"]
    repo.close()


@pytest.mark.parametrize("root,said", [("/", "the file system's root"), ("/etc/..", "the file system's root"),
                                       ("//", "the file system's root"), ("", "empty"), ("/etc/passwd", "not a folder"),
                                       ("/etc/passwd/x", "inside a file"),
                                       ("loop", "cannot use it")])
def test_an_artifact_root_that_cannot_be_one_is_refused_in_one_line(tmp_path, root, said):
    """`//` resolves to `/` but is not spelt like it; a symlink loop raised RuntimeError (review)."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    Repository.open(url).close()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    done = subprocess.run([sys.executable, "-m", "autotune", "dashboard", "--port", "0", "--storage", url,
                           "--artifact-root", root], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.fixture
def live_dashboard(tmp_path):
    """A dashboard over an empty store, serving in the background: (server, port)."""
    repo = Repository.open(f"sqlite:///{tmp_path / 'd.db'}")
    server = serve_in_background(repo)
    yield server, server.server_address[1]
    server.shutdown()
    repo.close()


def test_a_silent_connection_is_closed_and_the_server_answers_others(live_dashboard, monkeypatch):
    """Review: a client that opened a connection and sent half a request (slowloris) held a server thread
    for ever. A connection silent for IDLE_TIMEOUT_S (shortened here) is closed, quietly."""
    import socket

    from autotune.dashboard import server as dashboard_server

    monkeypatch.setattr(dashboard_server._Handler, "timeout", 0.5)
    server, port = live_dashboard
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: local")  # never finished
        assert _get(f"http://127.0.0.1:{port}/")[0] == 200  # others are answered meanwhile
        began = time.monotonic()
        assert slow.recv(1024) == b""  # closed by the server, without an answer
        assert time.monotonic() - began < 5


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_connections_over_the_cap_are_answered_503_at_once_and_a_freed_slot_serves_again(live_dashboard, monkeypatch):
    """Review: each connection held a thread for up to the idle timeout, however many a client opened. Over
    MAX_CONNECTIONS a connection gets 503 without a thread; a slot frees when its connection ends."""
    import socket

    from autotune.dashboard import server as dashboard_server

    monkeypatch.setattr(dashboard_server, "MAX_CONNECTIONS", 2)
    server, port = live_dashboard
    _wait_for(lambda: server.open_connections == 0)  # an earlier request's thread gone (it would take a slot)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    for connection in silent:  # a request begun and never finished: each holds its slot
        connection.sendall(b"GET / HTTP/1.1\r\nHost: local")
    assert _wait_for(lambda: server.open_connections == 2)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
        began = time.monotonic()
        answer = third.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 5" in answer and answer.endswith(b"retry later\n")
        assert time.monotonic() - began < 5  # at once, not after the idle timeout
    silent.pop().close()
    assert _wait_for(lambda: server.open_connections == 1)
    assert _get(f"http://127.0.0.1:{port}/")[0] == 200
    silent.pop().close()
    assert _wait_for(lambda: server.open_connections == 0)  # every slot given back


def test_a_request_trickled_a_line_at_a_time_is_cut_at_the_head_deadline(live_dashboard, monkeypatch):
    """Review: the idle timeout bounds each read only, so a client sending one header line just inside it
    held its thread (and a connection slot) for ever. The request's line and headers must all arrive within
    REQUEST_HEAD_DEADLINE_S (shortened here); a whole request is answered as before."""
    import socket

    from autotune.dashboard import server as dashboard_server

    monkeypatch.setattr(dashboard_server, "REQUEST_HEAD_DEADLINE_S", 1.0)
    monkeypatch.setattr(dashboard_server._Handler, "timeout", 0.6)
    server, port = live_dashboard
    with socket.create_connection(("127.0.0.1", port), timeout=10) as trickle:
        trickle.sendall(b"GET / HTTP/1.1\r\n")
        began, closed = time.monotonic(), False
        trickle.setblocking(False)
        for n in range(20):  # a header line every 0.3 s: each read well inside the idle timeout
            time.sleep(0.3)
            try:
                closed = trickle.recv(1024) == b""  # the server hung up (no answer to a half request)
            except BlockingIOError:  # still open
                trickle.sendall(b"X-Slow-%d: 1\r\n" % n)
            except OSError:  # reset
                closed = True
            if closed:
                break
        assert closed and time.monotonic() - began < 4
    assert _wait_for(lambda: server.open_connections == 0)
    assert _get(f"http://127.0.0.1:{port}/")[0] == 200


def test_an_artifact_root_that_does_not_exist_yet_is_a_warning(tmp_path):
    """The dashboard may start before the first study makes its --workdir (docker/compose.yaml does)."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    Repository.open(url).close()
    process = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--port", "0", "--storage", url,
                                "--artifact-root", str(tmp_path / "later")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert "autotune dashboard on http://" in process.stdout.readline()
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "does not exist (yet)" in stderr and str(tmp_path / "later") in stderr


def _ssl_study(tmp_path):
    """A store whose study `ssl` names /etc as its --workdir and /etc/ssl/openssl.cnf as an artifact."""
    repo = Repository.open(f"sqlite:///{tmp_path / 'd.db'}")
    _study_with_artifact(repo, "ssl", "/etc", "/etc/ssl/openssl.cnf")
    return repo


def test_a_root_swapped_for_a_link_to_the_file_systems_root_later_serves_nothing(tmp_path):
    """Review: a root was re-resolved on every request, so a root replaced by a symlink to `/` after the
    dashboard started (anyone who can write beside it can) made /etc/ssl "inside" it. Roots are pinned to
    the folder they named when first seen."""
    from autotune.dashboard._artifacts import check_roots
    from autotune.dashboard.server import DashboardApp

    if not (Path("/etc/ssl").is_dir() and Path("/etc/ssl/openssl.cnf").is_file()):
        pytest.skip("this machine has no /etc/ssl/openssl.cnf to aim at")
    plant = tmp_path / "plant"
    plant.mkdir()
    roots = check_roots([str(plant)])  # pinned while it is a real, empty folder
    repo = _ssl_study(tmp_path)
    plant.rmdir()
    plant.symlink_to("/")
    assert DashboardApp(repo, artifact_roots=roots).artifact("ssl", 1, "key") is None
    repo.close()


def test_a_default_root_someone_else_could_have_made_is_not_used(tmp_path):
    """The default root is in the world-writable /tmp: made first by another local user as a link to `/`
    (or anywhere), it would decide what is served. It is used only as a real folder owned by this user."""
    from autotune.dashboard._artifacts import ArtifactRoots

    (tmp_path / "link").symlink_to("/")
    assert ArtifactRoots((tmp_path / "link",), trusted=False).allowed() == []
    (tmp_path / "real").mkdir()
    assert ArtifactRoots((tmp_path / "real",), trusted=False).allowed() == [(tmp_path / "real").resolve()]
    assert ArtifactRoots((tmp_path / "link",), trusted=True).allowed() == []  # `/` is never a root


def test_a_workdir_swapped_for_a_link_between_the_check_and_the_open_leads_nowhere(tmp_path, monkeypatch):
    """Review: only the run folder and what lies below it were opened without following links; the workdir
    above it, swapped for a link to /etc after the check, was followed. The whole resolved path is now
    walked from `/` without following a link."""
    from autotune.dashboard import _artifacts

    root = tmp_path / "R"
    (root / "w" / "ssl").mkdir(parents=True)
    (root / "w" / "ssl" / "openssl.cnf").write_text("inside")
    if not Path("/etc/ssl/openssl.cnf").is_file():
        pytest.skip("this machine has no /etc/ssl/openssl.cnf to aim at")
    roots = _artifacts.check_roots([str(root)])
    options = {"workdir": str(root / "w")}
    path = str(root / "w" / "ssl" / "openssl.cnf")
    assert _read(_artifacts.open_confined(path, options, "ssl", roots)) == b"inside"
    real_confined = _artifacts._confined

    def swapped_after_the_check(*args):
        found = real_confined(*args)
        (root / "w").rename(root / "w.old")
        (root / "w").symlink_to("/etc")
        return found

    monkeypatch.setattr(_artifacts, "_confined", swapped_after_the_check)
    assert _read(_artifacts.open_confined(path, options, "ssl", roots)) is None


def test_a_trace_swapped_for_a_fifo_after_the_check_blocks_no_thread(tmp_path, monkeypatch):
    """Review: SQLite opened the checked path again, blocking, so a FIFO swapped in after the check held
    the page's thread for ever. The dashboard now reads a private copy of the file it opened and checked."""
    import os
    import threading

    from autotune.backends.runs import study_dir
    from autotune.dashboard import _artifacts
    from autotune.dashboard.server import DashboardApp

    options = {"workdir": str(tmp_path / "runs")}
    run = study_dir(options, "s") / "trial1-attempt1"
    run.mkdir(parents=True)
    trace = run / "profile.sqlite"
    trace.write_bytes(b"")
    repo = Repository.open(f"sqlite:///{tmp_path / 'd.db'}")
    _study_with_artifact(repo, "s", options["workdir"], str(trace))
    real_confined = _artifacts._confined

    def swapped_after_the_check(*args):
        found = real_confined(*args)
        trace.unlink()
        os.mkfifo(trace)
        return found

    monkeypatch.setattr(_artifacts, "_confined", swapped_after_the_check)
    app = DashboardApp(repo, artifact_roots=(tmp_path,))
    pages = []
    reader = threading.Thread(target=lambda: pages.append(app.trial_page("s", 1)), daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive() and pages and b"breakdown-chart" in pages[0]
    repo.close()


def test_a_slow_but_live_reader_gets_the_whole_artifact(served, monkeypatch):
    """Review: the idle timeout bounds each send, and an answer went out 1 MiB at a time, so a reader
    slower than ~17 kB/s (timeout 60 s) was cut off mid-file of a multi-MB artifact; it is sent 64 KiB at a
    time now. This check (timeout 0.5 s, a reader at ~400 kB/s) is of the outcome only: loopback's socket
    buffers absorb a 1 MiB send here, so it passes with the old chunk size too (the review's reproduction
    needed a 4 MB file at 100 kB/s, too slow for a test)."""
    import socket

    from autotune.dashboard import server as dashboard_server

    monkeypatch.setattr(dashboard_server._Handler, "timeout", 0.5)
    monkeypatch.setattr(dashboard_server, "MAX_ARTIFACT_BYTES", 512 * 1024)
    host, port = served.removeprefix("http://").split(":")
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        client.connect((host, int(port)))
        client.sendall(b"GET /artifact/s/1/big HTTP/1.0\r\nHost: localhost\r\n\r\n")
        received = bytearray()
        while chunk := client.recv(8192):  # about 400 kB/s: a 1 MiB send would take 2.6 s, past the timeout
            received += chunk
            time.sleep(0.02)
    body = bytes(received).partition(b"\r\n\r\n")[2]
    assert body == BIG[:512 * 1024]


def test_a_named_root_that_appears_later_must_be_a_real_folder_of_this_user(tmp_path):
    """Review: a root missing when the dashboard started was pinned to whatever appeared there first, so
    another user's link to a home folder made its `.ssh` servable. A root that appears later is held to
    the default root's rule: a real folder (not a link) owned by this user or root."""
    from autotune.dashboard._artifacts import check_roots

    home = tmp_path / "home"
    (home / "alice" / ".ssh").mkdir(parents=True)
    (home / "alice" / ".ssh" / "id_rsa").write_text("SECRET")
    later = tmp_path / "later"
    roots = check_roots([str(later)])
    later.symlink_to(home)  # made by someone else after the dashboard started
    assert roots.allowed() == [] and "not used: a link or a file" in str(roots)
    later.unlink()
    later.mkdir()
    assert roots.allowed() == [later.resolve()]  # a real folder of this user, once it is one


def test_a_relative_workdir_from_a_deleted_folder_is_one_line(tmp_path):
    """Review: `Path.absolute()` raised FileNotFoundError (a traceback, exit 1) when the shell's current
    folder had been deleted."""
    script = (f"mkdir {tmp_path}/gone && cd {tmp_path}/gone && rmdir {tmp_path}/gone && exec {sys.executable} -m "
              "autotune start --model qwen3_30b --budget 2 --backend megatron --dry-run --workdir rel")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-500:]
    assert "--workdir 'rel': a relative folder" in done.stderr
