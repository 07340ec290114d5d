"""What a session of an OCI image costs: provider ``image`` (bwrap over the image's root filesystem)
against plain ``bwrap`` (the host's ``/usr``), and provider ``docker`` where an engine answers.

All timings are client side (this process, through the providers' public API), and every ratio is
taken against a baseline measured in the same run, pair by pair (A B A B ...), so that a machine whose
speed drifts does not bias it. Each figure is printed as min / median / max over ``--reps`` runs:
quote the median; a wide spread says the machine was noisy (its load average is printed).

Measured, on the test image of ``tests/paddock/images.py`` (the host's dash, bash, coreutils, python3
and its standard library: about 50 MB, offline, from an OCI archive):

* **time to first session**: a fresh provider, ``create`` and the first ``exec("true")`` answered.
  *cold*: an empty image cache (``skopeo copy`` of the archive + ``umoci unpack`` + the session);
  *warm*: the image already unpacked in the cache (a new provider: the reference is resolved again).
* **per-session start overhead**: ``create`` + ``exec("true")`` + ``terminate`` on a warm provider,
  ``image`` against ``bwrap`` (and ``docker`` against ``bwrap`` when an engine answers).
* **disk per concurrent session**: 16 live sessions of the image, each having run a command:
  the unpacked image (once, shared) and what each session adds (its workspace, overlay and state,
  measured with ``du`` on its folder; ``docker``: the container's writable layer, ``--size``).
* **16 concurrent sessions**: 16 sessions created at once, each runs ``python3 -c ...``, all
  terminated: the wall time, against 16 concurrent plain ``bwrap`` sessions.

    python bench/image_sandbox.py [--reps 5] [--concurrent 16] [--no-docker]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the tests' image

from dressage.errors import SandboxUnavailableError
from dressage.paddock import Sandbox, SandboxProvider, SandboxSpec, get_provider
from dressage.paddock import container_engine as ce
from dressage.paddock.image_store import ImageStore
from tests.paddock.images import build_test_image, missing_tools

SPEC = dict(timeout_s=60.0, max_processes=256, memory_mb=1024, limits=("cgroup", "rlimit"))
WORK = "python3 -c 'import json, sys; print(json.dumps(sys.version_info[:2]))'"


def spread(xs: list[float], unit: str = "s", scale: float = 1.0) -> str:
    """``min / median / max`` of ``xs`` (times ``scale``) with ``unit``."""
    v = [x * scale for x in xs]
    return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f} {unit}"


def ratio_spread(a: list[float], b: list[float]) -> str:
    """min / median / max of the pairwise ratios a[i] / b[i]."""
    return spread([x / y for x, y in zip(a, b, strict=True)], "x")


def du(path: Path) -> int:
    """Bytes ``du`` counts under ``path`` (allocated blocks, hard links once)."""
    out = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=False).stdout
    return int(out.split()[0]) if out else 0


async def one_session(provider: SandboxProvider, spec: SandboxSpec, name: str) -> float:
    """Seconds for create + exec("true") + terminate on ``provider``."""
    t = time.perf_counter()
    sb = await provider.create(name, spec)
    r = await sb.exec("true")
    await sb.terminate()
    assert r.ok, r
    return time.perf_counter() - t


async def first_session(make: Callable[[], SandboxProvider], spec: SandboxSpec) -> float:
    """Seconds from a fresh provider to the first command's answer (the session then terminated)."""
    t = time.perf_counter()
    provider = make()
    sb = await provider.create("first", spec)
    r = await sb.exec("true")
    took = time.perf_counter() - t
    await sb.terminate()
    assert r.ok, r
    return took


async def concurrent(provider: SandboxProvider, spec: SandboxSpec, n: int) -> float:
    """Wall seconds for ``n`` sessions created at once, each running WORK, all terminated."""

    async def one(i: int) -> None:
        sb = await provider.create(f"c{i}", spec)
        try:
            r = await sb.exec(WORK)
            assert r.ok, r
        finally:
            await sb.terminate()

    t = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t


async def paired(
    reps: int, a: Callable[[], Awaitable[float]], b: Callable[[], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    """``reps`` runs of ``a`` and ``b`` in turn (A B A B ...), after one warm-up of each."""
    await a()
    await b()
    xs, ys = [], []
    for _ in range(reps):
        xs.append(await a())
        ys.append(await b())
    return xs, ys


async def disk_per_session(provider: SandboxProvider, spec: SandboxSpec, root: Path, n: int) -> int:
    """Bytes one of ``n`` live sessions adds under ``root`` (its folders), after each ran WORK."""
    before = du(root)
    sbs: list[Sandbox] = list(await asyncio.gather(*(provider.create(f"d{i}", spec) for i in range(n))))
    try:
        await asyncio.gather(*(sb.exec(WORK) for sb in sbs))
        return (du(root) - before) // n
    finally:
        await asyncio.gather(*(sb.terminate() for sb in sbs))


async def docker_disk(provider: SandboxProvider, spec: SandboxSpec, n: int) -> int:
    """Bytes the writable layer of one of ``n`` live docker sessions holds (``ps --size``), plus its workspace."""
    sbs = list(await asyncio.gather(*(provider.create(f"dd{i}", spec) for i in range(n))))
    try:
        await asyncio.gather(*(sb.exec(WORK) for sb in sbs))
        engine = await ce.find_engine()
        r = await ce.call(
            engine,
            "ps",
            "--size",
            "--format",
            "{{.Names}} {{.Size}}",
            "--filter",
            f"label={ce.LABEL_SESSION}",
        )
        print(f"  {engine.kind} ps --size (writable layer, virtual): {r.out.strip().splitlines()[:2]} ...")
        return sum(du(sb.root) for sb in sbs) // n  # type: ignore[attr-defined]
    finally:
        await asyncio.gather(*(sb.terminate() for sb in sbs))


def load_docker_image(docker_archive: str) -> str | None:
    """The test image loaded into the container engine found here, or None (said why)."""
    try:
        engine = asyncio.run(ce.find_engine())
    except SandboxUnavailableError as e:
        print(f"docker: skipped ({e})")
        return None
    path = docker_archive.split(":", 1)[1]
    r = subprocess.run([engine.cli, "load", "-q", "-i", path], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        print(f"docker: skipped ({engine.cli} load failed: {r.stderr.strip()})")
        return None
    return "localhost/dressage-test:latest"


async def bench_image(args: argparse.Namespace, ref: str, tmp: Path, docker_image: str | None) -> None:
    """Every measurement of the module doc; prints as it goes."""
    image_spec = SandboxSpec(provider="image", image=ref, **SPEC)  # type: ignore[arg-type]
    bwrap_spec = SandboxSpec(provider="bwrap", **SPEC)  # type: ignore[arg-type]
    cache = tmp / "cache"

    def fresh_store() -> ImageStore:
        shutil.rmtree(cache, ignore_errors=True)
        return ImageStore(cache, max_mb=100_000)

    cold = [
        await first_session(
            lambda: get_provider("image", root_dir=tmp / "ws", store=fresh_store()), image_spec
        )
        for _ in range(args.reps)
    ]
    store = ImageStore(cache, max_mb=100_000)
    warm = [
        await first_session(lambda: get_provider("image", root_dir=tmp / "ws", store=store), image_spec)
        for _ in range(args.reps)
    ]
    base = [
        await first_session(lambda: get_provider("bwrap", root_dir=tmp / "ws"), bwrap_spec)
        for _ in range(args.reps)
    ]
    print(f"time to first session, image cold (empty cache): {spread(cold)}")
    print(f"time to first session, image warm (cached):      {spread(warm)}")
    print(f"time to first session, plain bwrap:              {spread(base)}")

    image = get_provider("image", root_dir=tmp / "ws", store=store)
    bwrap = get_provider("bwrap", root_dir=tmp / "ws")
    a, b = await paired(
        args.reps, lambda: one_session(image, image_spec, "i"), lambda: one_session(bwrap, bwrap_spec, "b")
    )
    print(
        f"session create+exec+terminate, image: {spread(a)}; bwrap: {spread(b)}; image/bwrap {ratio_spread(a, b)}"
    )

    (tmp / "ws").mkdir(exist_ok=True)
    per = await disk_per_session(image, image_spec, tmp / "ws", args.concurrent)
    print(
        f"disk: the unpacked image {du(cache / 'rootfs') / 2**20:.1f} MiB once (cache total {du(cache) / 2**20:.1f} MiB); "
        f"each of {args.concurrent} live sessions adds {per / 2**10:.0f} KiB"
    )
    a, b = await paired(
        args.reps,
        lambda: concurrent(image, image_spec, args.concurrent),
        lambda: concurrent(bwrap, bwrap_spec, args.concurrent),
    )
    print(
        f"{args.concurrent} concurrent sessions (create, {WORK!r}, terminate), image: {spread(a)}; bwrap: {spread(b)}; "
        f"image/bwrap {ratio_spread(a, b)}"
    )
    if docker_image is not None:
        await bench_docker(args, docker_image, tmp, bwrap, bwrap_spec)


async def bench_docker(
    args: argparse.Namespace, image: str, tmp: Path, bwrap: SandboxProvider, bwrap_spec: SandboxSpec
) -> None:
    """The docker provider on the same image, against plain bwrap in the same run."""
    spec = SandboxSpec(provider="docker", image=image, **{**SPEC, "limits": ("cgroup",)})  # type: ignore[arg-type]
    docker = get_provider("docker", root_dir=tmp / "ws")
    await docker.limits_in_force(spec)
    first = [
        await first_session(lambda: get_provider("docker", root_dir=tmp / "ws"), spec)
        for _ in range(args.reps)
    ]
    print(
        f"docker ({(await ce.find_engine()).version}): time to first session (image in the engine): {spread(first)}"
    )
    a, b = await paired(
        args.reps, lambda: one_session(docker, spec, "k"), lambda: one_session(bwrap, bwrap_spec, "b")
    )
    print(
        f"docker session create+exec+terminate: {spread(a)}; bwrap: {spread(b)}; docker/bwrap {ratio_spread(a, b)}"
    )
    per = await docker_disk(docker, spec, args.concurrent)
    print(
        f"docker disk: each of {args.concurrent} live sessions' workspace {per / 2**10:.0f} KiB (writable layer above)"
    )
    a, b = await paired(
        args.reps,
        lambda: concurrent(docker, spec, args.concurrent),
        lambda: concurrent(bwrap, bwrap_spec, args.concurrent),
    )
    print(
        f"docker {args.concurrent} concurrent sessions: {spread(a)}; bwrap: {spread(b)}; docker/bwrap {ratio_spread(a, b)}"
    )


def main() -> None:
    """Build the test image, then measure (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--no-docker", action="store_true", help="skip provider docker")
    args = parser.parse_args()
    if missing_tools():
        sys.exit(f"cannot build the test image: {missing_tools()}")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average {os.getloadavg()}"
    )
    with tempfile.TemporaryDirectory(prefix="dressage-bench-image-") as d:
        tmp = Path(d)
        t = time.perf_counter()
        built = build_test_image(tmp / "image")
        print(
            f"test image built in {time.perf_counter() - t:.1f} s (oci-archive {du(Path(built.oci_archive.split(':', 1)[1])) / 2**20:.1f} MiB)"
        )
        docker_image = None if args.no_docker else load_docker_image(built.docker_archive)
        asyncio.run(bench_image(args, built.oci_archive, tmp, docker_image))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
