"""tk serve --ray: the same routes on Ray Serve, each model a deployment whose replicas batch across requests.

Fast tests drive the ingress's app in-process with a stand-in for a model deployment's handle: a replica that dies with a
request on it costs a retry on another replica, or a 503 with Retry-After, never a 500. The slow test runs a real Ray
cluster of two nodes on this machine (each a `ray start` of its own, one CPU each, so that two replicas land on two
nodes) and `tk serve --ray` on it: requests spread over both nodes, a replica killed with SIGKILL under load loses no
request, a rolling update to a replaced model directory fails none, and the replicas scale 1 -> 2 -> 1 with the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="tk serve --ray needs Ray Serve: pip install 'tk-onnx-deploy[ray]'")
import httpx  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from conftest import on_every_core  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from toolkit.cli import main as cli  # noqa: E402
from toolkit.deploy.translate import Translation  # noqa: E402
from toolkit.serve.app import ModelSpec, ServeConfig, create_app  # noqa: E402
from toolkit.serve.batcher import BatchPolicy  # noqa: E402
from toolkit.serve.ray_app import REPLICA_HEADER, RemoteBatcher, ReplicaHeader, Replicas, app_builder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "exported" / "transformer"


# The ingress, in-process, against a stand-in deployment handle.

class Response:
    """A stand-in for a DeploymentResponse: awaitable, and cancellable."""

    def __init__(self, coroutine):
        self.coroutine = coroutine
        self.cancelled = False

    def __await__(self):
        return self.coroutine.__await__()

    def cancel(self):
        self.cancelled = True


class Call:
    """A stand-in for a DeploymentHandle method: `.remote(...)` gives a Response of `answer(*args)` (awaited if a coroutine)."""

    def __init__(self, answer):
        self.answer = answer
        self.calls = 0
        self.responses: list[Response] = []

    def remote(self, *args):
        self.calls += 1

        async def answered():
            out = self.answer(*args)
            return await out if asyncio.iscoroutine(out) else out
        self.responses.append(Response(answered()))
        return self.responses[-1]


class Handle:
    def __init__(self, translate):
        self.translate = Call(translate)
        self.ready = Call(lambda: True)


def translated(texts, key, seconds, replica="model-0:r1@node1"):
    return {"translations": [[Translation(text=t.upper(), score=-0.5, tokens=1, source_tokens=1, sentences=1)] for t in texts],
            "replica": replica}


@contextmanager
def ingress(handle: Handle, retry_after_s: int = 1, timeout_s: float = 30.0):
    config = ServeConfig(retry_after_s=retry_after_s, timeout_s=timeout_s)
    app = ReplicaHeader(create_app([ModelSpec(lambda: None, description="stand-in")], config,
                                   batchers=[RemoteBatcher(handle, config.policy, "model-0")]))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        deadline = time.monotonic() + 10
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the ingress never became ready"
            time.sleep(0.02)
        yield client


def test_a_request_on_a_replica_that_dies_is_sent_again_to_a_live_one():
    answers = iter([ray.exceptions.ActorDiedError(), "ok"])

    def once_dead(texts, key, seconds):
        if isinstance(next(answers), Exception):
            raise ray.exceptions.ActorDiedError()
        return translated(texts, key, seconds, "model-0:r2@node2")

    handle = Handle(once_dead)
    with ingress(handle) as client:
        r = client.post("/v1/translate", json={"text": ["hello", "world"]})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == ["HELLO", "WORLD"]
    assert r.headers[REPLICA_HEADER] == "model-0:r2@node2"
    assert handle.translate.calls == 2


@pytest.mark.parametrize("death", [ray.exceptions.ActorDiedError(), ray.exceptions.ActorUnavailableError("gone", b"x" * 16),
                                   ray.exceptions.WorkerCrashedError()], ids=lambda e: type(e).__name__)
def test_a_request_whose_replicas_keep_dying_gets_503_with_retry_after_never_500(death):
    def dead(texts, key, seconds):
        raise death

    with ingress(Handle(dead)) as client:
        for route, body in (("/v1/translate", {"text": "hello"}), ("/translate", {"q": "hello", "source": "en", "target": "fr"})):
            r = client.post(route, json=body)
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            assert "retry" in r.json()["error"] and "\n" not in r.json()["error"]


def test_a_replica_that_is_stopping_passes_the_request_to_another():
    answers = iter([{"error": "NotReady", "message": "shutting down", "replica": "model-0:old@n1"}, None])

    def stopping_first(texts, key, seconds):
        return next(answers) or translated(texts, key, seconds, "model-0:new@n2")

    with ingress(Handle(stopping_first)) as client:
        r = client.post("/v1/translate", json={"text": "hello"})
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "model-0:new@n2", r.text


@pytest.mark.parametrize(("kind", "status"), [("QueueFull", 503), ("NotReady", 503), ("TooLarge", 413), ("UsageError", 422),
                                              ("TimeoutError", 504)])
def test_a_replica_refusal_keeps_the_status_tk_serve_gives_it(kind, status):
    with ingress(Handle(lambda texts, key, seconds: {"error": kind, "message": f"{kind} said so", "replica": "model-0:r1@n"})) as client:
        r = client.post("/v1/translate", json={"text": "hello"})
    assert r.status_code == status, r.text
    assert ("Retry-After" in r.headers) == (status == 503)


def test_a_request_past_its_timeout_is_cancelled_on_the_replica_too():
    async def never(texts, key, seconds):
        await asyncio.sleep(3600)

    handle = Handle(never)
    with ingress(handle, timeout_s=0.5) as client:
        r = client.post("/v1/translate", json={"text": "hello"})
    assert r.status_code == 504, r.text
    (response,) = handle.translate.responses
    assert response.cancelled


def test_the_deadline_travels_as_the_seconds_left():
    seen = []
    with ingress(Handle(lambda texts, key, seconds: seen.append(seconds) or translated(texts, key, seconds)), timeout_s=20) as client:
        assert client.post("/v1/translate", json={"text": "hello"}).status_code == 200
    assert 15 < seen[0] <= 20  # not a monotonic clock's reading, which another machine's clock would not share


def test_ray_serve_back_pressure_is_a_503_with_retry_after():
    def full(texts, key, seconds):
        raise BackPressureError(num_queued_requests=10, max_queued_requests=10)

    with ingress(Handle(full)) as client:
        r = client.post("/v1/translate", json={"text": "hello"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text


# Options and the application for a RayService.

def test_replicas_are_n_or_min_max():
    assert Replicas.parse("2") == Replicas(2, 2) and Replicas.parse("1:4") == Replicas(1, 4)
    assert Replicas.parse("3").scaling(8) == {"num_replicas": 3}
    assert Replicas.parse("1:4").scaling(8)["autoscaling_config"]["max_replicas"] == 4
    assert Replicas.parse("1:4").scaling(8)["autoscaling_config"]["downscale_delay_s"] == 30.0  # the declared default
    assert Replicas.parse("1:4", downscale_delay_s=2.0).scaling(8)["autoscaling_config"]["downscale_delay_s"] == 2.0


@pytest.mark.parametrize(("args", "says"), [
    (["--ray", "--replicas", "3:1"], "--replicas 3:1"),
    (["--ray", "--replicas", "0:2"], "MIN"),
    (["--ray", "--replicas", "many"], "MIN:MAX"),
    (["--replicas", "2"], "--ray"),
    (["--ray-address", "127.0.0.1:6379"], "--ray"),
    (["--downscale-delay-s", "2"], "--downscale-delay-s is an option of tk serve --ray"),
    (["--ray", "--downscale-delay-s", "-1"], "--downscale-delay-s"),
    (["--ray", "--ray-address", "nowhere"], "--ray-address"),
])
def test_bad_ray_options_are_one_line_errors(args, says):
    result = CliRunner().invoke(cli, ["serve", str(MODEL), *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output


def test_the_application_builds_from_tk_serve_arguments_as_a_rayservice_does():
    app = app_builder({"models": [str(MODEL)], "replicas": "1:3", "threads": 2, "max_delay_ms": 5, "downscale_delay_s": "2.5"})
    front = app._bound_deployment
    model = front.init_args[3]._bound_deployment
    assert front.name == "ingress" and front.ray_actor_options["num_cpus"] == 0
    assert model.name == "model-0-transformer" and model.ray_actor_options["num_cpus"] == 2
    scaling = model._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.downscale_delay_s) == (1, 3, 2.5)
    assert model.max_ongoing_requests >= BatchPolicy().queue_size  # Ray Serve must not queue what tk's batcher would batch
    with pytest.raises(Exception, match="unknown argument"):
        app_builder({"models": [str(MODEL)], "replica": "2"})
    on_gpu = app_builder({"models": [str(MODEL)], "provider": "cuda"})._bound_deployment.init_args[3]._bound_deployment
    assert on_gpu.ray_actor_options == {"num_cpus": 1, "num_gpus": 1} and on_gpu.num_replicas == 1


def test_without_ray_serve_tk_serve_ray_names_the_extra_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith(("ray.", "toolkit.serve.ray_"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as where the ray extra is not installed
    result = CliRunner().invoke(cli, ["serve", str(MODEL), "--ray"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "error: tk serve --ray needs ray (Ray Serve); install the ray extra: pip install 'tk-onnx-deploy[serve,ray]'"


def test_the_ray_modules_import_no_torch():
    code = "import sys, toolkit.serve.ray_app, toolkit.serve.ray_server; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


# A real cluster of two nodes on this machine.

RAY = Path(sys.executable).with_name("ray")
# Token authentication off for the cluster and everyone joining it, in the test's environment only (the nodes and tk serve
# agree); no usage reporting; one ONNX Runtime thread per replica, as each reserves one CPU.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
ENGLISH = ["I'm home.", "Tom is reading a book in the garden.", "We will see what happens tomorrow.", "Where is the station?"]


_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not given before by this process: the OS may hand a port just closed out again, and
    Ray refuses two of its components on one port ("dashboard_agent_http is trying to use a port number 41479 that is
    used by other components")."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def descendants(procs: list[subprocess.Popen]) -> list[psutil.Process]:
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(proc.pid)
            found += [root, *root.children(recursive=True)]
    return found


def end(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Ends these processes and every process they started, by their ids: SIGTERM (ray start --block stops its node),
    then SIGKILL for what is left. Never `ray stop`, which would end every Ray on the machine."""
    tree = descendants(procs)
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


class Cluster:
    def __init__(self, address: str, nodes: list[subprocess.Popen], env: dict):
        self.address, self.nodes, self.env = address, nodes, env

    def replica_processes(self, deployment: str) -> list[psutil.Process]:
        """The live processes of a deployment's replicas in this cluster (Ray names an actor's process after it)."""
        out = []
        for p in descendants(self.nodes):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE and " ".join(p.cmdline()).startswith(f"ray::ServeReplica:tk:{deployment}"):
                    out.append(p)
        return out


def start_node(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
                                                     "metrics-export-port", "node-manager-port", "object-manager-port")]
    # One CPU per node: a replica reserves one, so two replicas must be on two nodes. A small object store: answers are small.
    with on_every_core():
        return subprocess.Popen([str(RAY), "start", "--block", "--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats", *ports,
                                 *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    temp_dir = Path(f"/tmp/tk-ray-{os.getpid()}")  # Ray's socket paths must stay short: not under pytest's deep temp folders
    env = {**os.environ, **RAY_ENV}
    port = free_port()
    nodes = []
    try:
        nodes.append(start_node(["--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                                 f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}"], tmp / "head.log", env))
        wait_for(lambda: reachable(port) or nodes[0].poll() is not None, 90,
                 lambda: f"the head node never listened; {(tmp / 'head.log').read_text()[-2000:]}")
        assert nodes[0].poll() is None, f"the head node ended; {(tmp / 'head.log').read_text()[-2000:]}"
        nodes.append(start_node([f"--address=127.0.0.1:{port}"], tmp / "worker.log", env))
        wait_for(lambda: "Ray runtime started" in (tmp / "worker.log").read_text() or nodes[1].poll() is not None, 90,
                 lambda: f"the second node never joined; {(tmp / 'worker.log').read_text()[-2000:]}")
        assert nodes[1].poll() is None, f"the second node ended; {(tmp / 'worker.log').read_text()[-2000:]}"
        yield Cluster(f"127.0.0.1:{port}", nodes, env)
    finally:
        end(nodes)
        shutil.rmtree(temp_dir, ignore_errors=True)


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for(check, seconds: float, why, every: float = 0.5):
    """check()'s first true value within `seconds`, else an AssertionError saying `why` (a string, or a function giving
    it then: a log read when the wait is over, not before it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every)
    raise AssertionError(why() if callable(why) else why)


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: list[str]):
        self.proc, self.url, self.log = proc, url, log

    def replicas(self) -> dict:
        """The model's replicas by state (one model served)."""
        (states,) = httpx.get(f"{self.url}/replicas", timeout=30).json().values()
        return states


def serving(proc: subprocess.Popen, port: int, log: list[str]) -> None:
    """Reads tk serve --ray's output into log until it says it serves on port (an AssertionError with its output if it
    ends first), then goes on reading it in the background."""
    for line in proc.stdout:
        log.append(line)
        if "serving" in line and f":{port}" in line:
            break
    else:
        raise AssertionError(f"tk serve --ray did not start (exit {proc.wait()}):\n{''.join(log)[-3000:]}")
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()


@contextmanager
def tk_serve(cluster: Cluster, model: Path, replicas: str, *options: str):
    """tk serve --ray on the cluster, until SIGTERM, which must stop it cleanly (exit 0)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", str(model), "--ray", "--ray-address", cluster.address,
                             "--replicas", replicas, "--port", str(port), *options], env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True, cwd=REPO)
    log: list[str] = []
    try:
        serving(proc, port, log)
        server = Server(proc, f"http://127.0.0.1:{port}", log)
        wait_for(lambda: httpx.get(f"{server.url}/ready", timeout=10).status_code == 200, 60, "the server never became ready")
        yield server
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, "".join(log)[-3000:]
    finally:
        # A test that failed inside the block: SIGTERM first, so tk serve shuts down the Serve it started on the cluster
        # (killed outright it leaves Serve running there, and every later test on the cluster fails on it).
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


@dataclass
class Answer:
    status: int  # the final one, after retrying 503s (0: no answer at all)
    retries: int  # 503s with Retry-After before it
    replica: str
    at: float


class Load:
    """Clients sending one translation after another until stopped, each retrying a 503 after its Retry-After as a client
    of tk serve should; every request's final answer is kept."""

    def __init__(self, url: str, clients: int, texts: list[str]):
        self.url, self.texts = url, texts
        self.answers: list[Answer] = []
        self.stopped = threading.Event()
        self.pool = ThreadPoolExecutor(clients)
        self.running = [self.pool.submit(self.client) for _ in range(clients)]

    def client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stopped.is_set():
                retries, status, replica = 0, 0, ""
                while True:
                    try:
                        r = client.post("/v1/translate", json={"text": self.texts})
                        status, replica = r.status_code, r.headers.get(REPLICA_HEADER, "")
                    except httpx.TransportError:
                        status = 0
                    if status == 503 and retries < 20:
                        retries += 1
                        time.sleep(float(r.headers.get("Retry-After", "1")))
                        continue
                    break
                self.answers.append(Answer(status, retries, replica, time.monotonic()))

    def since(self, t: float) -> list[Answer]:
        return [a for a in self.answers if a.at >= t]

    def stop(self) -> list[Answer]:
        self.stopped.set()
        for f in self.running:
            f.result(120)
        self.pool.shutdown()
        return self.answers


def node(replica: str) -> str:
    return replica.rpartition("@")[2]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_replicas_on_two_nodes_survive_a_killed_replica_and_a_rolling_update(cluster, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    with tk_serve(cluster, model, "2:2") as server:
        load = Load(server.url, 6, ENGLISH[:2])
        try:
            # Requests spread over the two replicas, one on each node.
            wait_for(lambda: len({node(a.replica) for a in load.answers if a.status == 200}) == 2, 60,
                     f"answers came from one node only: {Counter(a.replica for a in load.answers)}")

            # A replica killed with SIGKILL under load: every request is answered 200, at worst after retrying a 503.
            victims = cluster.replica_processes("model-0-model")
            assert len(victims) == 2, victims
            before = {a.replica for a in load.answers}
            killed_at = time.monotonic()
            victims[0].kill()
            wait_for(lambda: server.replicas().get("RUNNING") == 2 and any(a.replica not in before for a in load.since(killed_at)), 90,
                     f"the killed replica was never replaced: {server.replicas()}")
            wait_for(lambda: len(load.since(time.monotonic() - 2)) > 0, 30, "no answers after the replacement")
            around_kill = load.since(killed_at)
            assert {a.status for a in around_kill} == {200}, Counter((a.status, a.retries) for a in around_kill)

            # A second tk serve on the same cluster takes nothing over: one line, and the first one serves on.
            other = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", str(MODEL), "--ray", "--ray-address", cluster.address,
                                    "--port", server.url.rpartition(":")[2]], env=cluster.env, capture_output=True, text=True, timeout=120, cwd=REPO)
            assert other.returncode == 2 and "a tk application already runs" in other.stderr.strip().splitlines()[-1], other.stderr[-2000:]

            # A rolling update: the directory replaced by a new export, then SIGHUP. No request fails.
            old = {a.replica for a in load.answers}
            new_export = tmp_path / "model.new"
            shutil.copytree(MODEL, new_export)
            model.rename(tmp_path / "model.old")
            new_export.rename(model)
            updated_at = time.monotonic()
            server.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "redeployed" in "".join(server.log), 120, f"never redeployed:\n{''.join(server.log)[-3000:]}")
            # Ray Serve stops the old replicas before the redeploy returns; requests they held end within a second.
            settled = time.monotonic() + 2
            fresh = wait_for(lambda: time.monotonic() > settled + 1 and {a.replica for a in load.since(settled)}, 30, "no answers after the update")
            assert not fresh & old, f"replicas of before the update still answer: {fresh & old}"
            during = load.since(updated_at)
        finally:
            answers = load.stop()
        assert {a.status for a in during} == {200} and all(a.retries == 0 for a in during), Counter((a.status, a.retries) for a in during)
        assert {a.status for a in answers} == {200}, Counter((a.status, a.retries) for a in answers)
        print(f"{len(answers)} requests; retried after a 503: {sum(a.retries > 0 for a in answers)}; "
              f"replicas: {len({a.replica for a in answers})}", file=sys.stderr)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replicas_scale_up_under_load_and_back_down_after_it(cluster):
    # Down 2 s after the load ends (--downscale-delay-s) rather than 30: what is proven is that it scales down at all.
    with tk_serve(cluster, MODEL, "1:2", "--downscale-delay-s", "2") as server:
        assert server.replicas() == {"RUNNING": 1}
        # Requests of many sentences keep the one replica's queue well over its target while the load lasts.
        load = Load(server.url, 24, ENGLISH * 4)
        try:
            wait_for(lambda: server.replicas().get("RUNNING") == 2, 90, f"never scaled up: {server.replicas()}", every=1)
            wait_for(lambda: len({node(a.replica) for a in load.answers[-20:]}) == 2, 30, "the second replica never answered")
        finally:
            answers = load.stop()
        assert {a.status for a in answers} == {200}, Counter((a.status, a.retries) for a in answers)
        wait_for(lambda: server.replicas() == {"RUNNING": 1}, 120, f"never scaled back down: {server.replicas()}", every=2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_model_that_does_not_load_on_the_replicas_is_one_line_and_leaves_the_cluster_as_found(cluster, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(MODEL, broken)
    (broken / "encoder.onnx").write_bytes((MODEL / "encoder.onnx").read_bytes()[:1000])
    r = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", str(broken), "--ray", "--ray-address", cluster.address, "--port",
                        str(free_port())], env=cluster.env, capture_output=True, text=True, timeout=150, cwd=REPO)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "model-0-broken" in last and "encoder.onnx" in last and "re-export" in last, last
    # Serve, which this tk serve started on the cluster, is gone with it.
    wait_for(lambda: not any("ServeController" in " ".join(p.cmdline()) for p in descendants(cluster.nodes) if p.is_running()), 30,
             "Ray Serve was left running on the cluster")

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_local_ray_ends_with_a_tk_serve_killed_outright():
    """Without --ray-address tk serve --ray starts its own Ray; SIGKILL leaves nothing of it behind."""
    port = free_port()
    with on_every_core():  # the Ray it starts
        proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", str(MODEL), "--ray", "--port", str(port)],
                                env={**os.environ, **RAY_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    tree: list[psutil.Process] = []
    try:
        serving(proc, port, [])
        r = httpx.post(f"http://127.0.0.1:{port}/v1/translate", json={"text": "I'm home."}, timeout=60)
        assert r.status_code == 200 and r.headers[REPLICA_HEADER].startswith("model-0-transformer:"), r.text
        tree = descendants([proc])
        assert any(" ".join(p.cmdline()).startswith("ray::ServeReplica") for p in tree), "no replica process found"
        proc.kill()
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    finally:
        for p in [*tree, psutil.Process(proc.pid)] if proc.poll() is None else tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_libretranslate_clients_keys_detection_and_files_work_on_ray_as_on_tk_serve(cluster, tmp_path):
    """The operators' features go through the same app on Ray: each LibreTranslate client people use (its key
    included) gets tk translate's text; a request without a key 403, one over its rate 429; source "auto" and /detect;
    a subtitle file goes up and comes back translated."""
    from deep_translator import LibreTranslator
    from libretranslate_aio import LibreTranslate
    from libretranslatepy import LibreTranslateAPI

    from toolkit.deploy.api import Translator

    texts = ["I'm home.", "Where is the station?"]
    want = Translator(MODEL, provider="cpu", variant="fp32").translate(texts)
    keys = tmp_path / "keys.txt"
    keys.write_text("client-key-1\nslow-key-22 2\n", encoding="utf-8")
    with tk_serve(cluster, MODEL, "1", "--api-keys", str(keys)) as server:
        url = server.url
        assert [LibreTranslateAPI(url, api_key="client-key-1").translate(t, "en", "fr") for t in texts] == want
        assert [LibreTranslator(source="en", target="fr", api_key="client-key-1", custom_url=f"{url}/").translate(t) for t in texts] == want
        with LibreTranslate(url, api_key="client-key-1") as aio:
            assert aio.translate(texts, source="en", target="fr").translated_text == want
        npm = REPO / "tests" / "serve" / "npm"
        run = subprocess.run(["node", str(npm / "translate.mjs"), url, "-", "fr", *texts], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "API_KEY": "client-key-1"})
        assert run.returncode == 0 and [json.loads(line) for line in run.stdout.splitlines()] == want, run.stderr
        assert httpx.post(f"{url}/translate", json={"q": texts[0], "source": "en", "target": "fr"}, timeout=60).status_code == 403
        slow = [httpx.post(f"{url}/translate", json={"q": texts[0], "source": "en", "target": "fr", "api_key": "slow-key-22"}, timeout=60)
                for _ in range(3)]
        assert [r.status_code for r in slow] == [200, 200, 429] and "Retry-After" in slow[2].headers
        auto = httpx.post(f"{url}/translate", json={"q": texts[1], "source": "auto", "target": "fr", "api_key": "client-key-1"}, timeout=60)
        assert (auto.json()["translatedText"], auto.json()["detectedLanguage"]["language"]) == (want[1], "en")
        assert httpx.post(f"{url}/detect", data={"q": texts[0], "api_key": "client-key-1"}, timeout=60).json()[0]["language"] == "en"
        srt = "1\n00:00:01,000 --> 00:00:02,000\nI'm home.\n\n"
        r = httpx.post(f"{url}/translate_file", data={"source": "en", "target": "fr", "api_key": "client-key-1"},
                       files={"file": ("a.srt", srt.encode())}, timeout=60)
        assert r.status_code == 200, r.text
        path = r.json()["translatedFileUrl"].split("/download_file", 1)[1]
        assert httpx.get(f"{url}/download_file{path}", timeout=60).text == srt.replace("I'm home.", want[0])
