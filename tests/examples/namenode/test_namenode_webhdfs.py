"""The namenode example with REAL, unmodified WebHDFS clients on real processes: two
namenode replicas (active + standby), real etcd, real bookies.

- HdfsCLI (``hdfs.InsecureClient`` with both URLs, ``;``-separated): a tree of files
  from 0 bytes to several blocks written, listed, stat'ed, renamed, permissions and
  owners set, read back byte-identical (whole and by offset/length), deleted — once
  with the active's URL first, once with the standby's (writes forwarded).
- fsspec's ``webhdfs``: ls, info, open/read, put, against the standby.
- Bad input: the WebHDFS error a Hadoop client expects, and nothing logged (txid unchanged).
- Fail-over: the active SIGKILLed; the client carries on through the standby, every
  acknowledged change is there, and the restarted replica reaches the same digest.
"""

from __future__ import annotations

import getpass
import http.client
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hdfs import HdfsError, InsecureClient
from namenode_procs import NamenodeProc, active_of, namenode_cluster, payload

from scriba.testing.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BLOCK = 1024 * 1024  # small blocks: a few MiB make multi-block files
SIZES = {"empty": 0, "tiny": 1, "small": 1000, "entry": 256 * 1024 + 3, "blocks": 2 * BLOCK + 12345}


@pytest.fixture(scope="module")
def namenodes(etcd_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NamenodeProc]]:
    with namenode_cluster(etcd_cluster, tmp_path_factory.mktemp("namenode"), 2, "nn") as nodes:
        yield nodes


def ordered(nodes: list[NamenodeProc], active_first: bool) -> list[NamenodeProc]:
    active = active_of(nodes)
    standby = [n for n in nodes if n is not active]
    return [active, *standby] if active_first else [*standby, active]


@pytest.mark.parametrize("active_first", [True, False], ids=["active", "standby"])
def test_hdfscli_roundtrip(namenodes: list[NamenodeProc], active_first: bool) -> None:
    nodes = ordered(namenodes, active_first)
    client = InsecureClient(";".join(n.url for n in nodes), user="alice")
    root = f"/hdfscli-{'a' if active_first else 's'}"
    client.makedirs(f"{root}/in/deep", permission="750")
    for name, size in SIZES.items():
        client.write(f"{root}/in/{name}", data=payload(name, size), blocksize=BLOCK, replication=3)
    assert sorted(client.list(f"{root}/in")) == sorted([*SIZES, "deep"])
    for name, size in SIZES.items():
        status = client.status(f"{root}/in/{name}")
        assert (status["type"], status["length"], status["owner"]) == ("FILE", size, "alice")
        with client.read(f"{root}/in/{name}") as reader:
            assert reader.read() == payload(name, size)
    with client.read(f"{root}/in/blocks", offset=BLOCK - 10, length=BLOCK + 20) as reader:
        assert reader.read() == payload("blocks", SIZES["blocks"])[BLOCK - 10:2 * BLOCK + 10]
    assert client.status(f"{root}/in/deep")["permission"] == "750"
    assert client.content(f"{root}/in")["length"] == sum(SIZES.values())
    client.write(f"{root}/in/copy", data=payload("blocks", SIZES["blocks"]), blocksize=BLOCK)
    checksum = client.checksum(f"{root}/in/copy")
    assert checksum == client.checksum(f"{root}/in/blocks") != client.checksum(f"{root}/in/entry")
    client.delete(f"{root}/in/copy")
    client.write(f"{root}/in/small", data=b"+more", append=True)
    with client.read(f"{root}/in/small") as reader:
        assert reader.read() == payload("small", 1000) + b"+more"
    client.rename(f"{root}/in", f"{root}/out")
    assert client.status(f"{root}/in", strict=False) is None
    client.set_permission(f"{root}/out/tiny", "600")
    superuser = InsecureClient(client.url, user="hdfs")
    superuser.set_owner(f"{root}/out/tiny", owner="bob", group="staff")
    status = client.status(f"{root}/out/tiny")
    assert (status["permission"], status["owner"], status["group"]) == ("600", "bob", "staff")
    with pytest.raises(HdfsError, match="already exists"):
        client.write(f"{root}/out/tiny", data=b"x")
    with pytest.raises(HdfsError, match="access=WRITE"):  # bob's now, 600: alice may not overwrite it
        client.write(f"{root}/out/tiny", data=b"replaced", overwrite=True)
    superuser.write(f"{root}/out/tiny", data=b"replaced", overwrite=True)
    with client.read(f"{root}/out/tiny") as reader:
        assert reader.read() == b"replaced"
    with pytest.raises(HdfsError, match="non empty"):
        client.delete(f"{root}/out")
    assert client.delete(f"{root}/out", recursive=True) is True
    assert client.status(root)["childrenNum"] == 0
    digests = {n.replica_id: n.digest("linearizable") for n in nodes}
    assert len({(d["txid"], d["digest"]) for d in digests.values()}) == 1, digests


def test_fsspec_webhdfs_on_the_standby(namenodes: list[NamenodeProc], tmp_path: Path) -> None:
    from fsspec.implementations.webhdfs import WebHDFS

    standby = ordered(namenodes, active_first=False)[0]
    fs = WebHDFS(host="127.0.0.1", port=standby.port, user="carol")
    local = tmp_path / "local.bin"
    local.write_bytes(payload("fsspec", 3 * 100_000))
    fs.mkdir("/fsspec/dir")
    fs.put(str(local), "/fsspec/dir/file.bin")
    with fs.open("/fsspec/dir/w.txt", "wb") as f:
        f.write(b"hello ")
        f.write(b"world")
    assert sorted(fs.ls("/fsspec/dir", detail=False)) == ["/fsspec/dir/file.bin", "/fsspec/dir/w.txt"]
    assert fs.info("/fsspec/dir/file.bin")["size"] == 300_000
    assert fs.cat("/fsspec/dir/w.txt") == b"hello world"
    with fs.open("/fsspec/dir/file.bin", "rb") as f:
        f.seek(99_990)
        assert f.read(20) == payload("fsspec", 300_000)[99_990:100_010]
    with pytest.raises(FileNotFoundError):
        fs.info("/fsspec/nope")


def test_bad_input_gets_hadoops_errors_and_logs_nothing(namenodes: list[NamenodeProc]) -> None:
    node = active_of(namenodes)
    client = InsecureClient(node.url, user="dave")
    client.makedirs("/bad/full/sub")
    client.write("/bad/f", data=b"0123456789")
    before = node.digest("linearizable")

    def call(method: str, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        answer = requests.request(method, f"{node.url}/webhdfs/v1{path}", params={"user.name": "dave", **params},
                                  timeout=30, allow_redirects=False)
        return answer.status_code, answer.json() if answer.content else {}

    for method, path, params, status, exception in (
        ("PUT", "/bad/a:b", {"op": "MKDIRS"}, 400, "InvalidPathException"),
        ("PUT", "/bad/x", {"op": "FROB"}, 400, "IllegalArgumentException"),
        ("PUT", "/bad/x", {"op": "MKDIRS", "permission": "999"}, 400, "IllegalArgumentException"),
        ("PUT", "/bad/x", {"op": "RENAME", "destination": "rel/x"}, 400, "InvalidPathException"),
        ("GET", "/bad/f", {"op": "OPEN", "offset": "-1"}, 400, "IllegalArgumentException"),
        ("GET", "/bad/f", {"op": "OPEN", "offset": "abc"}, 400, "IllegalArgumentException"),
        ("GET", "/bad/missing", {"op": "GETFILESTATUS"}, 404, "FileNotFoundException"),
    ):
        code, body = call(method, path, **params)
        assert (code, body["RemoteException"]["exception"]) == (status, exception), (path, params, body)
        assert body["RemoteException"]["javaClassName"] and body["RemoteException"]["message"]
    for raw in ("/webhdfs/v1/bad/../x?op=MKDIRS", "/webhdfs/v1/bad/%2E%2E/x?op=MKDIRS", "/webhdfs/v1/bad//x?op=MKDIRS"):
        # sent as is (requests would remove dot segments before they reach the server)
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
        conn.request("PUT", raw)
        answer = conn.getresponse()
        body = json.loads(answer.read())
        conn.close()
        assert (answer.status, body["RemoteException"]["exception"]) == (400, "InvalidPathException"), raw
    assert node.digest("linearizable") == before  # none of them reached the edit log
    # semantic errors are edit records that fail the same way on every replica
    code, body = call("DELETE", "/bad", op="DELETE", recursive="false")
    assert (code, body["RemoteException"]["exception"]) == (403, "PathIsNotEmptyDirectoryException")
    assert call("PUT", "/bad", op="RENAME", destination="/bad/full/sub/x") == (200, {"boolean": False})
    code, body = call("GET", "/bad/f", op="OPEN", offset="11")
    assert code == 403 and "out of the range" in body["RemoteException"]["message"]
    assert client.status("/bad")["childrenNum"] == 2
    assert node.digest("linearizable")["txid"] == before["txid"] + 2  # the check above can fail: these were logged


def test_active_killed_clients_fail_over_and_nothing_acknowledged_is_lost(namenodes: list[NamenodeProc]) -> None:
    nodes = ordered(namenodes, active_first=True)
    active, standby = nodes
    client = InsecureClient(";".join(n.url for n in nodes), user="erin")
    acknowledged: dict[str, bytes] = {}
    for i in range(5):
        name = f"/failover/before-{i}"
        client.write(name, data=payload(name, 5000 * i))
        acknowledged[name] = payload(name, 5000 * i)
    # a writer keeps going while the active dies: whatever it was told succeeded must survive
    stop, failed = threading.Event(), []

    def load() -> None:
        loader = InsecureClient(";".join(n.url for n in nodes), user="erin")
        for i in itertools.count():
            if stop.is_set():
                return
            name = f"/failover/load-{i}"
            try:
                loader.write(name, data=payload(name, 3000))
            except (HdfsError, requests.RequestException) as exc:  # in flight at the kill: not acknowledged
                failed.append(repr(exc))
                continue
            acknowledged[name] = payload(name, 3000)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 10, 30.0, what="load writes", interval_s=0.05)
        active.kill()
        assert active_of([standby], timeout_s=60) is standby
        count = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= count + 5, 60, what="load writes after the fail-over", interval_s=0.05)
    finally:
        stop.set()
        thread.join(60)
    for i in range(5):
        name = f"/failover/after-{i}"
        client.write(name, data=payload(name, 7000 * i))
        acknowledged[name] = payload(name, 7000 * i)
    client.rename("/failover/before-0", "/failover/renamed-0")
    acknowledged["/failover/renamed-0"] = acknowledged.pop("/failover/before-0")
    listed = {f"/failover/{n}" for n in client.list("/failover")}
    assert set(acknowledged) <= listed, sorted(set(acknowledged) - listed)
    assert len(listed - set(acknowledged)) <= len(failed)  # only writes in flight at the kill may be extra
    for name, data in acknowledged.items():
        with client.read(name) as reader:
            assert reader.read() == data, name
    active.start()  # back as a standby: replays snapshot + tail to the same namespace
    fresh = NamenodeProc(active.uri, "nn9", active.log_path.parent, active.namespace).start()  # never ran
    try:
        want = standby.digest("linearizable")
        for node in (active, fresh):
            wait_until(lambda n=node: n.digest() == want, 60, what=f"{node.replica_id}'s digest", interval_s=0.05)
            assert node.status()["role"] == "standby"  # type: ignore[index]
        assert fresh.status()["rsm"]["snapshot_position"] is not None  # type: ignore[index]
    finally:
        fresh.stop()


def test_standby_reads_after_a_position(namenodes: list[NamenodeProc]) -> None:
    active, standby = ordered(namenodes, active_first=True)
    answer = requests.put(f"{active.url}/webhdfs/v1/after/dir", params={"op": "MKDIRS"}, timeout=30)
    position = answer.headers["X-Scriba-Position"]
    status = requests.get(f"{standby.url}/webhdfs/v1/after/dir", timeout=30, params={
        "op": "GETFILESTATUS", "scriba_consistency": "after", "scriba_after": position})
    assert status.json()["FileStatus"]["type"] == "DIRECTORY"
    missing = requests.get(f"{standby.url}/webhdfs/v1/after/dir", timeout=30, params={
        "op": "GETFILESTATUS", "scriba_consistency": "after"})
    assert missing.status_code == 400 and "scriba_after" in missing.json()["RemoteException"]["message"]


def test_permissions_over_webhdfs(namenodes: list[NamenodeProc]) -> None:
    """HDFS's AccessControlException, as a Hadoop client expects it (403, RemoteException),
    for writes (through the standby's forwarding too) and reads; nothing denied is stored."""
    active, standby = ordered(namenodes, active_first=True)
    owner = InsecureClient(active.url, user="frank")
    owner.makedirs("/perm/frank", permission="700")
    owner.write("/perm/frank/secret", data=b"s3cret")
    other = InsecureClient(f"{standby.url};{active.url}", user="gina")
    raw = requests.get(f"{standby.url}/webhdfs/v1/perm/frank/secret", params={"op": "OPEN", "user.name": "gina"},
                       timeout=30)
    error = raw.json()["RemoteException"]
    assert (raw.status_code, error["exception"], error["javaClassName"]) == (
        403, "AccessControlException", "org.apache.hadoop.security.AccessControlException")
    assert error["message"] == ('Permission denied: user=gina, access=EXECUTE, '
                                'inode="/perm/frank":frank:supergroup:drwx------')
    with pytest.raises(HdfsError, match="Permission denied: user=gina, access=EXECUTE") as denied:
        other.write("/perm/frank/planted", data=b"x")
    assert denied.value.exception == "AccessControlException"
    assert owner.status("/perm/frank/planted", strict=False) is None
    with pytest.raises(HdfsError, match="access=WRITE"):
        other.delete("/perm/frank", recursive=True)
    with pytest.raises(HdfsError, match="gina is not the owner"):
        other.set_permission("/perm/frank", "777")
    with pytest.raises(HdfsError, match="non-super user cannot change owner"):
        owner.set_owner("/perm/frank", owner="gina")
    assert owner.list("/perm/frank") == ["secret"]
    owner.set_permission("/perm/frank", "755")  # the owner opens it: reads now pass, writes still not
    with other.read("/perm/frank/secret") as reader:
        assert reader.read() == b"s3cret"
    with pytest.raises(HdfsError, match='access=WRITE, inode="/perm/frank"'):
        other.write("/perm/frank/planted", data=b"x")


def test_spark_webhdfs_filesystem(namenodes: list[NamenodeProc], spark: Any) -> None:
    """Spark's own ``webhdfs://`` file system (Hadoop's WebHdfsFileSystem): a DataFrame
    written through the standby (Spark's output committer: mkdirs, create, rename, delete,
    _SUCCESS) and read back through the active, byte for byte with HdfsCLI's view of it."""
    active, standby = ordered(namenodes, active_first=True)
    rows = [(i, "v" * (i % 7) + str(i)) for i in range(3000)]
    spark.createDataFrame(rows, "id long, v string").repartition(3).write.mode("overwrite") \
        .parquet(f"webhdfs://127.0.0.1:{standby.port}/spark/rows.parquet")
    back = spark.read.parquet(f"webhdfs://127.0.0.1:{active.port}/spark/rows.parquet")
    assert sorted((r.id, r.v) for r in back.collect()) == rows
    client = InsecureClient(active.url, user=getpass.getuser())  # Spark's user: it owns /spark
    names = client.list("/spark/rows.parquet")
    assert "_SUCCESS" in names and not any(n.startswith("_temporary") for n in names), names
    assert sum(n.startswith("part-") and n.endswith(".parquet") for n in names) == 3, names
    # files a Python client wrote, read by Spark (several files, one spanning blocks)
    big = b"".join(f"{i},{'x' * 50}\n".encode() for i in range(40_000))
    client.write("/spark/in/a.csv", data=b"-1,a\n-2,b\n")
    client.write("/spark/in/big.csv", data=big, blocksize=BLOCK)
    assert client.status("/spark/in/big.csv")["length"] > 2 * BLOCK
    frame = spark.read.csv(f"webhdfs://127.0.0.1:{standby.port}/spark/in", schema="n long, s string")
    assert frame.count() == 40_002
    assert sorted(r.n for r in frame.collect()) == [-2, -1, *range(40_000)]
    # Spark's overwrite of a directory it wrote (delete recursive, then the committer again)
    spark.createDataFrame([(7,)], "k int").write.mode("overwrite").json(
        f"webhdfs://127.0.0.1:{active.port}/spark/rows.parquet")
    assert [r.k for r in spark.read.json(f"webhdfs://127.0.0.1:{standby.port}/spark/rows.parquet").collect()] == [7]
    missing = f"webhdfs://127.0.0.1:{active.port}/spark/nope"
    with pytest.raises(Exception, match="Path does not exist"):
        spark.read.parquet(missing).collect()
    # HDFS's AccessControlException reaches Spark as Hadoop's own exception class
    private = InsecureClient(active.url, user="hilda")
    private.makedirs("/spark-private", permission="700")
    private.write("/spark-private/a.csv", data=b"1,a\n")
    with pytest.raises(Exception, match=r"org\.apache\.hadoop\.security\.AccessControlException"):
        spark.read.csv(f"webhdfs://127.0.0.1:{active.port}/spark-private").collect()
