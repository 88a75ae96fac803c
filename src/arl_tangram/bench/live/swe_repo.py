"""Shell: the small, real Python repositories the live SWE workload trains on, generated
offline per task (pure: files as ``{path: text}``; the images are built by ``swe_images``).

A task's repository (at ``/testbed`` in its image) holds a package ``taskpkg`` with one
seeded bug, a visible test suite of tens of tests (a few of them CPU-heavy, ~0.1-1 s each),
the tools the rollout runs (``run_tests.py``: an elastic test runner over ``$TANGRAM_DOP``
forked workers; ``setup_dev.py``: the set-up step, a code generator whose output the
package imports; ``tools/profile_mem.py``: the memory-spiky step), and nothing of the
answer: the fix and the hidden tests live in ``SweTask`` and reach the env only as the
rollout's edit and the reward's test file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: the buggy function's correct body and two ways of getting it wrong, per bug kind: the
#: task's repo ships ``buggy``, a right rollout writes ``fixed``, a wrong one ``wrong_fix``
#: (which passes the visible failing test but not the hidden edge cases)
BUGS: dict[str, dict[str, str]] = {
    "window": {
        "fixed": "def window_sums(xs, k):\n    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)] if 0 < k <= len(xs) else []\n",
        "buggy": "def window_sums(xs, k):\n    return [sum(xs[i:i + k]) for i in range(len(xs) - k)] if 0 < k <= len(xs) else []\n",
        "wrong_fix": "def window_sums(xs, k):\n    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]\n",
    },
    "clamp": {
        "fixed": "def clamp(x, lo, hi):\n    if lo > hi:\n        raise ValueError('lo > hi')\n    return lo if x < lo else hi if x > hi else x\n",
        "buggy": "def clamp(x, lo, hi):\n    if lo > hi:\n        raise ValueError('lo > hi')\n    return lo if x < lo else hi if x >= hi + 1 else x\n",
        "wrong_fix": "def clamp(x, lo, hi):\n    return lo if x < lo else hi if x > hi else x\n",
    },
    "checksum": {
        "fixed": "def checksum(data):\n    crc = 0xFFFFFFFF\n    for b in data:\n        crc = _tables.CRC[(crc ^ b) & 0xFF] ^ (crc >> 8)\n    return crc ^ 0xFFFFFFFF\n",
        "buggy": "def checksum(data):\n    crc = 0\n    for b in data:\n        crc = _tables.CRC[(crc ^ b) & 0xFF] ^ (crc >> 8)\n    return crc ^ 0xFFFFFFFF\n",
        "wrong_fix": "def checksum(data):\n    crc = 0xFFFFFFFF\n    for b in data[:64]:\n        crc = _tables.CRC[(crc ^ b) & 0xFF] ^ (crc >> 8)\n    return crc ^ 0xFFFFFFFF\n",
    },
}
BUG_KINDS = tuple(sorted(BUGS))
#: a visible test that fails on the buggy tree and passes on both fixes, per bug kind
VISIBLE_FAILING = {
    "window": "def test_window_basic():\n    assert core.window_sums([1, 2, 3, 4], 2) == [3, 5, 7]\n",
    "clamp": "def test_clamp_upper():\n    assert core.clamp(10.5, 0, 10) == 10\n",
    "checksum": "def test_checksum_known():\n    assert core.checksum(b'123456789') == 0xCBF43926\n",
}
#: the hidden tests (the reward): edge cases only the right fix passes
HIDDEN = {
    "window": "def test_hidden_window_edges():\n    assert core.window_sums([1, 2], 3) == []\n    assert core.window_sums([5], 1) == [5]\n    assert core.window_sums([1, 2], 0) == []\n",
    "clamp": "def test_hidden_clamp_edges():\n    assert core.clamp(10.5, 0, 10) == 10\n    try:\n        core.clamp(1, 5, 0)\n    except ValueError:\n        pass\n    else:\n        raise AssertionError('lo > hi must raise')\n",
    "checksum": "def test_hidden_checksum_long():\n    data = bytes(range(256)) * 2\n    assert core.checksum(data) == zlib.crc32(data)\n",
}
CORE_TAIL = '''

def collatz_len(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def is_prime(n):
    return n < _tables.SIEVE_LIMIT and _tables.PRIMES[n] == 1
'''


@dataclass(frozen=True)
class RepoConfig:
    """The generated repositories' sizes (all reported by the bench)."""

    fast_tests: int = 20  # assumption: cheap unit tests per suite ("tens of tests")
    heavy_tests: int = 5  # assumption: CPU-heavy tests per suite (~0.1-0.35 s each at DoP 1; sized so the demo fits its budget)
    heavy_work: int = 6_000  # collatz lengths computed per heavy test (~0.11 s of CPU here; each test runs 1..3 times it)
    setup_work: int = 500_000  # rounds of the set-up code generator's hash chain (~0.75 s of CPU; with the sieve and byte-compile ~1 s)
    sieve_limit: int = 3_000_000  # the generator's prime sieve: ~3 MB of table, ~25 MB of generation memory


@dataclass(frozen=True)
class SweTask:
    """One task: its repo's files, the bug it carries, the right and the wrong edit of
    ``taskpkg/core.py``, and the hidden test file the reward runs."""

    task_id: str
    bug: str
    files: dict[str, str]
    fixed_core: str
    wrong_core: str
    hidden_tests: str


def _core(bug: str, variant: str) -> str:
    funcs = [BUGS[k][variant if k == bug else "fixed"] for k in BUG_KINDS]
    return '"""taskpkg.core: the functions under test."""\n\nfrom taskpkg import _tables\n\n\n' + "\n\n".join(funcs) + CORE_TAIL


def _tests(task: int, bug: str, cfg: RepoConfig, rng: random.Random) -> str:
    lines = ["import zlib\n\nfrom taskpkg import core\n\n", VISIBLE_FAILING[bug], "\n"]
    for k in range(cfg.fast_tests):
        a, b = rng.randint(0, 50), rng.randint(51, 100)
        lines.append(f"def test_fast_{k:02d}():\n    assert core.clamp({a}, {a}, {b}) == {a}\n    assert core.is_prime(2) and not core.is_prime({2 * b})\n\n")
    for k in range(cfg.heavy_tests):
        n = cfg.heavy_work * (1 + k % 3)
        lines.append(f"def test_heavy_{k:02d}():\n    assert sum(core.collatz_len(i) for i in range(1, {n})) > {n}\n\n")
    return "".join(lines)


def make_task(index: int, seed: int, cfg: RepoConfig) -> SweTask:
    """Task ``index``'s repository, seeded by (seed, index); the bug kind cycles so that
    every kind appears once T >= 3."""
    rng = random.Random(seed * 1_000_003 + index)
    bug = BUG_KINDS[(index + seed) % len(BUG_KINDS)]
    files = {
        "taskpkg/__init__.py": f'"""taskpkg: task {index} of the SWE workload."""\n',
        "taskpkg/core.py": _core(bug, "buggy"),
        "tests/test_core.py": _tests(index, bug, cfg, rng),
        "run_tests.py": RUN_TESTS,
        "setup_dev.py": SETUP_DEV.replace("@ROUNDS@", str(cfg.setup_work)).replace("@LIMIT@", str(cfg.sieve_limit)),
        "tools/profile_mem.py": PROFILE_MEM,
        "README.md": f"# task {index}\n\nRun `python3 setup_dev.py` once, then `python3 run_tests.py`.\n",
    }
    hidden = "import zlib\n\nfrom taskpkg import core\n\n\n" + HIDDEN[bug]
    return SweTask(f"swe-{index:02d}", bug, files, _core(bug, "fixed"), _core(bug, "wrong_fix"), hidden)


RUN_TESTS = '''"""Elastic test runner: test_* functions of tests/*.py (or the files named), split over
$TANGRAM_DOP forked workers; -k SUBSTR selects by name. Prints one JSON line
{"passed", "failed", "total", "workers"}; exits 0 when all passed, 1 otherwise."""
import importlib.util, json, multiprocessing, os, sys, traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def collect(paths, pattern):
    tests = []
    for path in paths:
        spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        tests += [(path, n) for n in sorted(vars(mod)) if n.startswith("test_") and pattern in n]
    return tests

def run_one(item):
    path, name = item
    try:
        spec = importlib.util.spec_from_file_location("t", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        getattr(mod, name)()
        return name, None
    except Exception:
        return name, traceback.format_exc(limit=2)

def main(argv):
    pattern = argv[argv.index("-k") + 1] if "-k" in argv else ""
    paths = [a for a in argv if a.endswith(".py")] or sorted(
        os.path.join("tests", f) for f in os.listdir("tests") if f.startswith("test_") and f.endswith(".py"))
    tests = collect(paths, pattern)
    workers = max(1, min(int(os.environ.get("TANGRAM_DOP", "1")), len(tests) or 1))
    if workers == 1:
        results = [run_one(t) for t in tests]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(run_one, tests, chunksize=1)
    failed = [n for n, err in results if err]
    for n, err in results:
        if err:
            print(n, err, file=sys.stderr)
    print(json.dumps({"passed": len(results) - len(failed), "failed": failed, "total": len(results), "workers": workers}))
    return 0 if not failed and results else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

SETUP_DEV = '''"""Set-up step (the rollout's "pip install -e . && build"): generate taskpkg/_tables.py
(a CRC table, a prime sieve, a hash-chain digest), byte-compile the package, and leave
.setup-done with the digest. The package cannot be imported before it ran."""
import compileall, hashlib, json, os, sys

ROUNDS, LIMIT = @ROUNDS@, @LIMIT@
os.chdir(os.path.dirname(os.path.abspath(__file__)))
crc = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
    crc.append(c)
sieve = bytearray([1]) * LIMIT
sieve[0:2] = b"\\x00\\x00"
for i in range(2, int(LIMIT ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytes(len(range(i * i, LIMIT, i)))
h = b"seed"
for _ in range(ROUNDS):
    h = hashlib.sha256(h).digest()
with open("taskpkg/_tables.py", "w") as f:
    f.write("CRC = %r\\nSIEVE_LIMIT = %d\\nDIGEST = %r\\n" % (crc, LIMIT, h.hex()))
    f.write("import zlib as _z\\nPRIMES = _z.decompress(%r)\\n" % __import__("zlib").compress(bytes(sieve), 1))
ok = compileall.compile_dir("taskpkg", quiet=1)
with open(".setup-done", "w") as f:
    json.dump({"digest": h.hex(), "primes": sum(sieve), "compiled": bool(ok)}, f)
print(json.dumps({"setup": "done", "digest": h.hex()[:16]}))
sys.exit(0 if ok else 1)
'''

PROFILE_MEM = '''"""The memory-spiky step (a profiler, a big fixture, a build's link step): touch MIB
mebibytes for a moment, then report, with what the touching cost: seconds on a CPU and
seconds runnable but waiting for one (``/proc/self/schedstat``), so a slow spike says
whether it worked or queued. Usage: python3 tools/profile_mem.py MIB"""
import json, sys, time

def sched():
    try:
        run_ns, wait_ns = open("/proc/self/schedstat").read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0

mib = int(sys.argv[1])
t0, (run0, wait0) = time.monotonic(), sched()
block = bytearray(b"\\x01") * (mib << 20)  # written, so every page is resident
total = sum(block[:: 1 << 16])
(run1, wait1), alloc_s = sched(), time.monotonic() - t0
time.sleep(0.2)
print(json.dumps({"peak_mib": mib, "touched": total, "alloc_s": round(alloc_s, 4),
                  "alloc_run_s": round(run1 - run0, 4), "alloc_wait_s": round(wait1 - wait0, 4)}))
'''
